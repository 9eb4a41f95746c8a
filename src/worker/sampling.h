// Sampler settings and the llama.cpp sampler chain built from them. Every
// placement of a model builds the chain the same way from the same settings,
// which is what makes greedy and seeded outputs equal across placements.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "api/openai_request.h"
#include "common/status.h"

struct llama_sampler;
struct llama_vocab;

namespace spillway::worker {

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
  // GBNF (root rule "root") the output must match, e.g. a forced tool call
  // (ToolCallGrammar); "" = none. Set per request, never a default.
  std::string grammar;
};

// Fills unset request fields from `defaults`; an unset seed becomes `fresh_seed`.
SamplerSettings ResolveSampling(const api::SamplingRequest& req, const SamplerSettings& defaults, uint32_t fresh_seed);

// Order (as llama-server's default): penalties, top_k, top_p, min_p, temperature, dist;
// temperature 0: penalties, greedy. `ban_end_of_generation` (benchmarks'
// ignore_eos) puts a -inf bias on every end-of-generation token first.
// A grammar comes before all of them: every sampler sees only tokens it
// allows, and as a member of the chain it advances with every accepted token,
// so a continuation that samples the delivered tokens again replays it too.
// The caller owns the chain (llama_sampler_free); null when the grammar does
// not parse (CheckGrammar tells why first).
llama_sampler* BuildSamplerChain(const SamplerSettings& s, const llama_vocab* vocab, bool ban_end_of_generation);

// Whether llama.cpp accepts `grammar` for `vocab` (kInternal if not: the
// worker builds every grammar itself).
Status CheckGrammar(const std::string& grammar, const llama_vocab* vocab);

nlohmann::json SamplingJson(const SamplerSettings& s, bool with_seed);

}  // namespace spillway::worker
