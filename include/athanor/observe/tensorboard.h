#pragma once
// TensorBoard event files without TensorFlow or protobuf: TFRecord framing and the
// few protobuf messages scalars and histograms need (Event, Summary, Summary.Value,
// HistogramProto), hand-encoded in the field numbers of TensorFlow's summary.proto.
//
//   TensorBoardWriter tb(run_dir + "/tb");          // events.out.tfevents.<secs>.<host>
//   tb.add_scalar("train/loss", 2.31, /*step=*/10);
//
// TensorBoardSink writes StepMetrics/EvalMetrics as scalars (tags listed in tensorboard.cpp)
// and the step's histograms (weights/<param>, grads/<param>) when it carries them.
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "athanor/observe/metrics.h"

namespace athanor::observe {

class TensorBoardWriter {
 public:
  // Creates `dir` if needed and a new event file in it, starting with the file_version event.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // wall_time < 0: now. Each record is flushed, so a crash loses at most the record being written.
  void add_scalar(const std::string& tag, double value, int64_t step, double wall_time = -1);
  // Several scalars of one step, written and flushed together: a crash loses at most this call's.
  void add_scalars(const std::vector<std::pair<std::string, double>>& scalars, int64_t step, double wall_time = -1);
  // Histograms of one step (TensorBoard's "Histograms" and "Distributions" tabs), one write.
  void add_histograms(const std::vector<Histogram>& histograms, int64_t step, double wall_time = -1);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  void write_framed(const std::string& records);
  std::string path_;
  std::FILE* file_ = nullptr;
};

// Protobuf encodings, exposed for tests.
std::string encode_file_version_event(double wall_time, const std::string& version);
std::string encode_scalar_event(double wall_time, int64_t step, const std::string& tag, float value);
std::string encode_histogram_event(double wall_time, int64_t step, const Histogram& h);
// length, masked CRC of the length, data, masked CRC of the data.
std::string frame_tfrecord(const std::string& data);

class TensorBoardSink : public MetricsSink {
 public:
  explicit TensorBoardSink(const std::string& dir) : writer_(dir) {}
  void on_step(const StepMetrics& m) override;
  void on_eval(const EvalMetrics& m) override;
  const std::string& path() const { return writer_.path(); }

 private:
  TensorBoardWriter writer_;
};

}  // namespace athanor::observe
