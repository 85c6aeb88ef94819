// The planner's model and layout values (plan/spec.h).
#include "athanor/plan/spec.h"

#include <sstream>

#include "athanor/core/error.h"

namespace athanor::plan {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::f32: return "f32";
    case Precision::bf16: return "bf16";
    case Precision::f16: return "f16";
  }
  return "?";
}

Precision parse_precision(const std::string& s) {
  if (s == "f32") return Precision::f32;
  if (s == "bf16") return Precision::bf16;
  if (s == "f16") return Precision::f16;
  ATH_FAIL("plan", "unknown precision '", s, "'", Hint{"trainer.precision is one of f32, bf16, f16"});
}

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::gpipe: return "gpipe";
    case Schedule::one_f_one_b: return "1f1b";
    case Schedule::interleaved: return "interleaved";
    case Schedule::zb_h1: return "zb-h1";
  }
  return "?";
}

Schedule parse_schedule(const std::string& s) {
  if (s == "gpipe") return Schedule::gpipe;
  if (s == "1f1b") return Schedule::one_f_one_b;
  if (s == "interleaved") return Schedule::interleaved;
  if (s == "zb-h1") return Schedule::zb_h1;
  ATH_FAIL("plan", "unknown pipeline schedule '", s, "'", Hint{"dist.pp_schedule is one of gpipe, 1f1b, interleaved, zb-h1"});
}

const char* family_name(Family f) { return f == Family::llama ? "llama" : "gpt"; }

std::vector<BlockLinear> ModelSpec::block_linears(int tp) const {
  const double h = static_cast<double>(n_embd), t = tp;
  if (llama()) {
    const double kv = kv_width_per_rank(tp), I = static_cast<double>(intermediate);
    // nn::Llama: q/k/v and gate/up column-parallel (by key/value-head group), o and down row-parallel.
    return {{"q_proj", h / t, h, true},         {"k_proj", kv, h, true},  {"v_proj", kv, h, true},
            {"o_proj", h, h / t, false},        {"gate_proj", I / t, h, true}, {"up_proj", I / t, h, true},
            {"down_proj", h, I / t, false}};
  }
  // nn::GPT: c_attn and c_fc column-parallel, the two projections row-parallel.
  return {{"c_attn", 3 * h / t, h, true}, {"attn.c_proj", h, h / t, false}, {"c_fc", 4 * h / t, h, true},
          {"mlp.c_proj", h, 4 * h / t, false}};
}

// nn::GPT's block: ln_1 (2h), c_attn (3h² + 3h), c_proj (h² + h), ln_2 (2h), c_fc (4h² + 4h), mlp.c_proj (4h² + h).
// nn::Llama's: the seven Linears without biases and two RMSNorm weights (h each).
int64_t ModelSpec::block_params() const {
  const int64_t h = n_embd;
  if (llama()) {
    const int64_t kv = kv_heads() * head_dim();
    return 2 * h * h + 2 * h * kv + 3 * h * intermediate + 2 * h;
  }
  return 12 * h * h + (bias ? 13 * h : 2 * h);  // without biases, only the LayerNorms' weights
}
int64_t ModelSpec::embedding_params() const { return llama() ? vocab * n_embd : (vocab + seq) * n_embd; }
int64_t ModelSpec::final_norm_params() const { return bias && !llama() ? 2 * n_embd : n_embd; }
int64_t ModelSpec::head_params() const { return tie_embeddings ? 0 : vocab * n_embd; }
int64_t ModelSpec::total_params() const {
  return n_layer * block_params() + embedding_params() + final_norm_params() + head_params();
}

ModelSpec llama_model(const nn::LlamaConfig& c, const std::string& name) {
  ModelSpec m;
  m.name = name;
  m.family = Family::llama;
  m.n_layer = c.n_layer, m.n_head = c.n_head, m.n_kv_head = c.n_kv_head, m.n_embd = c.n_embd;
  m.intermediate = c.intermediate_size;
  m.seq = c.block_size;
  m.vocab = c.vocab_size;
  m.bias = false;
  m.dropout = c.dropout;
  m.tie_embeddings = c.tie_embeddings;
  m.rope_theta = c.rope_theta, m.rms_norm_eps = c.rms_norm_eps;
  return m;
}

nn::LlamaConfig llama_config(const ModelSpec& m) {
  nn::LlamaConfig c;
  c.vocab_size = m.vocab, c.n_layer = m.n_layer, c.n_head = m.n_head, c.n_kv_head = m.kv_heads(), c.n_embd = m.n_embd;
  c.intermediate_size = m.intermediate;
  c.block_size = m.seq;
  c.tie_embeddings = m.tie_embeddings;
  c.dropout = m.dropout;
  c.rope_theta = m.rope_theta, c.rms_norm_eps = m.rms_norm_eps;
  return c;
}

int TrainSpec::optimizer_states() const {
  if (optimizer == "adam" || optimizer == "adamw" || optimizer == "lamb") return 2;
  if (optimizer == "rmsprop" || optimizer == "lars") return 1;
  if (optimizer == "sgd") return momentum > 0 ? 1 : 0;
  return 2;
}

std::string Layout::str() const {
  std::ostringstream o;
  o << "dp " << dp << " tp " << tp << " pp " << pp;
  if (pp > 1) {
    o << " (" << schedule_name(schedule);
    if (virtual_stages > 1) o << " v" << virtual_stages;
    o << ")";
  }
  o << " zero " << zero << " mb " << micro_batch << " x" << accum;
  if (sequence_parallel) o << " sp";
  if (recompute) o << " recompute";
  return o.str();
}

std::string layout_problem(const TrainSpec& spec, const Layout& l) {
  const ModelSpec& m = spec.model;
  std::ostringstream o;
  if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.virtual_stages < 1 || l.micro_batch < 1 || l.accum < 1) {
    o << "every layout size must be >= 1 (" << l.str() << ")";
  } else if (m.llama() && m.kv_heads() % l.tp != 0 && l.tp % m.kv_heads() != 0) {
    o << "n_kv_head " << m.kv_heads() << " and tp " << l.tp
      << " do not divide one another (the Llama is split by key/value-head group: each tensor-parallel rank holds "
         "n_kv_head / tp key/value heads and their query heads, or one replicated key/value head when tp is a multiple "
         "of n_kv_head)";
  } else if (m.llama() && m.intermediate % l.tp != 0) {
    o << "intermediate_size " << m.intermediate << " does not divide by tp " << l.tp
      << " (gate_proj/up_proj rows and down_proj columns are split across the tensor-parallel ranks)";
  } else if (m.llama() && l.sequence_parallel) {
    o << "the planner does not model the Llama's sequence parallelism yet (athanor trains it; plan without it)";
  } else if (m.n_head % l.tp != 0) {
    o << "n_head " << m.n_head << " does not divide by tp " << l.tp << " (the heads are split across the tensor-parallel ranks)";
  } else if (m.n_layer % (static_cast<int64_t>(l.pp) * l.virtual_stages) != 0) {
    o << "n_layer " << m.n_layer << " does not divide by pp " << l.pp
      << (l.virtual_stages > 1 ? " x virtual stages " + std::to_string(l.virtual_stages) : std::string())
      << " (each stage holds the same number of blocks)";
  } else if (l.sequence_parallel && l.tp == 1) {
    o << "sequence parallelism needs tp > 1";
  } else if (l.sequence_parallel && m.seq % l.tp != 0) {
    o << "seq " << m.seq << " does not divide by tp " << l.tp << " (sequence parallelism splits the sequence)";
  } else if (l.zero < 0 || l.zero > 3) {
    o << "ZeRO stage " << l.zero << " does not exist (0..3)";
  } else if (l.pp > 1 && l.zero > 1) {
    o << "ZeRO-" << l.zero << " with pp " << l.pp << ": athanor refuses it (a stage holds every micro-batch's gradient until the step's one reduction)";
  } else if (l.virtual_stages > 1 && l.schedule != Schedule::interleaved) {
    o << "virtual stages are for the interleaved schedule only";
  } else if (l.schedule == Schedule::interleaved && l.accum % l.pp != 0) {
    o << "the interleaved schedule needs the micro-batches (" << l.accum << ") to be a multiple of pp " << l.pp;
  } else if (l.tp > 1 && (spec.optimizer == "lamb" || spec.optimizer == "lars")) {
    o << spec.optimizer << " with tp > 1: its trust ratio needs whole weights";
  }
  return o.str();
}

void check_layout(const TrainSpec& spec, const Layout& l) {
  const std::string p = layout_problem(spec, l);
  ATH_CHECK(p.empty(), "plan", "the layout ", l.str(), " does not fit the model: ", p,
            Hint{std::string("choose tp dividing ") + (spec.model.llama() ? "model.n_kv_head (or a multiple of it dividing model.n_head)" : "model.n_head") +
                 ", pp (x dist.virtual_stages) dividing model.n_layer; `athanor plan` without a fixed layout searches "
                 "only the layouts that divide"});
}

void check_model(const ModelSpec& m) {
  ATH_CHECK(m.n_layer >= 1 && m.n_head >= 1 && m.n_embd >= 1 && m.seq >= 1 && m.vocab >= 1, "plan",
            "the model needs positive sizes (model.n_layer ", m.n_layer, ", model.n_head ", m.n_head, ", model.n_embd ",
            m.n_embd, ", model.block_size ", m.seq, ", vocabulary ", m.vocab, ")",
            Hint{"set them in the config's model section"});
  ATH_CHECK(m.n_embd % m.n_head == 0, "plan", "model.n_embd (", m.n_embd, ") does not divide by model.n_head (", m.n_head,
            "): every head gets n_embd / n_head channels", Hint{"choose n_embd a multiple of n_head"});
  if (m.llama()) {
    // nn::Llama's own rules (n_kv_head divides n_head, an even head dim, ...): one definition.
    const std::string problem = nn::llama_config_problem(llama_config(m));
    ATH_CHECK(problem.empty(), "plan", "model.type llama: ", problem, " (keys model.<name>)",
              Hint{"e.g. n_embd 768, n_head 12, n_kv_head 4, intermediate_size 2048"});
  }
}

}  // namespace athanor::plan
