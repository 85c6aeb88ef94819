#pragma once
// Hugging Face Llama interop: a directory with model.safetensors and config.json laid out
// as transformers' LlamaForCausalLM saves it.
//
// Names and layout are athanor's nn::Llama's unchanged (model.embed_tokens.weight,
// model.layers.<i>.self_attn.q_proj.weight, …, lm_head.weight): HF's Linear stores
// [out, in] like athanor's, and athanor's RoPE pairs dims (i, i + head_dim/2) as HF's
// rotate_half does, so q_proj/k_proj need no permutation. With tie_word_embeddings the
// file has no lm_head.weight (HF re-ties it on load); an imported one must equal
// embed_tokens. The rotary_emb.inv_freq buffers older files carry are ignored (athanor
// recomputes them). F16/BF16/F64 weights are converted to f32.
//
// Supported config: hidden_act "silu", attention_bias and mlp_bias false, head_dim
// hidden_size / num_attention_heads, rope_scaling null / "default" / "llama3",
// attention_dropout 0. Anything else is an Error naming config.json and the key.
#include <string>

#include "athanor/nn/llama.h"

namespace athanor::ckpt {

// Writes OUT_DIR/model.safetensors (f32) and OUT_DIR/config.json (creating OUT_DIR).
void export_hf_llama(const nn::Llama& model, const std::string& out_dir);

struct HfLlama {
  nn::LlamaConfig config;
  nn::StateDict state;  // athanor names and layout, f32, ready for Llama::load_state_dict
};
// Reads DIR/config.json and DIR/model.safetensors; every problem (a missing, extra or
// misshapen tensor, an unsupported config key) is an Error naming the file and the key.
HfLlama import_hf_llama(const std::string& dir);
// import_hf_llama + a Llama built from the config with the weights loaded.
std::shared_ptr<nn::Llama> load_hf_llama(const std::string& dir);

// The LlamaConfig JSON (transformers' keys) for an athanor config.
std::string hf_llama_config_json(const nn::LlamaConfig& config);

// The family a Hugging Face config.json describes, from its model_type (or, without one,
// its architectures): "gpt2", "llama", or an Error naming the file and what it found.
std::string hf_model_family(const std::string& config_json_path);

}  // namespace athanor::ckpt
