// Sampler settings and the llama.cpp sampler chain built from them. Every
// placement of a model builds the chain the same way from the same settings,
// which is what makes greedy and seeded outputs equal across placements.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "api/openai_request.h"
#include "common/status.h"

struct llama_sampler;
struct llama_vocab;

namespace spillway::worker {

// A grammar the output must match (llama.cpp GBNF, root rule "root").
struct GrammarSpec {
  std::string gbnf;  // "" = none
  // Lazy: free until a trigger (a regex over the output, or a token) appears,
  // then constrained from the trigger on (tool_choice "auto").
  bool lazy = false;
  std::vector<std::string> trigger_patterns;
  std::vector<int32_t> trigger_tokens;
  // Accepted by an eager grammar before generation: the generation prompt
  // the template already put at the end of the prompt (llama-server's prefill).
  std::vector<int32_t> prefill;
  bool empty() const { return gbnf.empty(); }
};

struct SamplerSettings {
  float temperature = 0.8f;  // 0 = greedy
  float top_p = 0.95f;
  int32_t top_k = 40;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  int32_t repeat_last_n = 64;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  uint32_t seed = 0;
  // The request's "logit_bias" (ids checked by CheckLogitBias); set per
  // request, never a default.
  std::vector<api::TokenBias> logit_bias;
  // A forced tool call or a response_format (from llama.cpp's chat layer);
  // set per request, never a default.
  GrammarSpec grammar;
};

// Fills unset request fields from `defaults`; an unset seed becomes `fresh_seed`.
SamplerSettings ResolveSampling(const api::SamplingRequest& req, const SamplerSettings& defaults, uint32_t fresh_seed);

// Order (as llama-server's default): penalties, top_k, top_p, min_p, temperature, dist;
// temperature 0: penalties, greedy. First of all, one logit-bias sampler (as
// llama-server merges them) adds the request's logit_bias and, with
// `banned` (null: none): tokens at -inf, every end-of-generation token for
// ignore_eos (benchmarks'), the model's list found once at load.
// A grammar comes before all of them: every sampler sees only tokens it
// allows, and as a member of the chain it advances with every accepted token,
// so a continuation that samples the delivered tokens again replays it too.
// The caller owns the chain (llama_sampler_free); null when the grammar does
// not parse (CheckGrammar tells why first).
llama_sampler* BuildSamplerChain(const SamplerSettings& s, const llama_vocab* vocab,
                                 const std::vector<int32_t>* banned = nullptr);

// Whether llama.cpp accepts `grammar` (and its prefill) for `vocab`
// (kInvalidArgument if not: e.g. a schema the converter turned into a grammar
// that allows nothing).
Status CheckGrammar(const GrammarSpec& grammar, const llama_vocab* vocab);

// Whether every token of `bias` is in `vocab` (kInvalidArgument naming the
// first that is not, and the vocabulary's size).
Status CheckLogitBias(const std::vector<api::TokenBias>& bias, const llama_vocab* vocab);

nlohmann::json SamplingJson(const SamplerSettings& s, bool with_seed);

}  // namespace spillway::worker
