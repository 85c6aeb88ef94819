#pragma once
// Hugging Face GPT-2 interop: a directory with model.safetensors and config.json
// laid out as transformers' GPT2LMHeadModel saves it.
//
// Names: HF's state dict uses athanor's GPT names ("transformer.h.0.attn.c_attn.weight", ...);
// files on the Hub often omit the "transformer." prefix — the importer accepts both.
// Layout: HF's Conv1D (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) stores its
// weight as [in, out], the transpose of athanor's Linear [out, in]; export and
// import transpose those four weights. lm_head is tied to wte and not written
// (HF re-ties it on load); an lm_head.weight in an imported file must equal wte.
// The causal-mask buffers some files carry (attn.bias [1,1,n,n], attn.masked_bias)
// are ignored. F16/BF16/F64 weights are converted to f32.
//
// Supported config: activation_function "gelu_new" (tanh GELU, what athanor's GPT
// uses), layer_norm_epsilon 1e-5, n_inner null or 4*n_embd, no
// scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn, equal dropout rates.
#include <string>

#include "athanor/nn/gpt.h"

namespace athanor::ckpt {

// Writes OUT_DIR/model.safetensors and OUT_DIR/config.json (creating OUT_DIR).
void export_hf_gpt2(const nn::GPT& model, const std::string& out_dir);

struct HfGpt2 {
  nn::GPTConfig config;
  nn::StateDict state;  // athanor names and layout, f32, ready for GPT::load_state_dict
};
// Reads DIR/config.json and DIR/model.safetensors; every problem is an Error
// naming the file and the key or tensor.
HfGpt2 import_hf_gpt2(const std::string& dir);
// import_hf_gpt2 + a GPT built from the config with the weights loaded.
std::shared_ptr<nn::GPT> load_hf_gpt2(const std::string& dir);

// The GPT2Config JSON for an athanor config (exposed for tests and the CLI).
std::string hf_gpt2_config_json(const nn::GPTConfig& config);

}  // namespace athanor::ckpt
