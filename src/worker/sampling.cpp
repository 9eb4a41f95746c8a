#include "worker/sampling.h"

#include "worker/grammar_bounds.h"

#include <llama.h>

#include <cmath>
#include <exception>
#include <string>
#include <vector>

namespace spillway::worker {

SamplerSettings ResolveSampling(const api::SamplingRequest& r, const SamplerSettings& d, uint32_t fresh_seed) {
  SamplerSettings s = d;
  s.temperature = r.temperature.value_or(d.temperature);
  s.top_p = r.top_p.value_or(d.top_p);
  s.top_k = r.top_k.value_or(d.top_k);
  s.min_p = r.min_p.value_or(d.min_p);
  s.repeat_penalty = r.repeat_penalty.value_or(d.repeat_penalty);
  s.repeat_last_n = r.repeat_last_n.value_or(d.repeat_last_n);
  s.frequency_penalty = r.frequency_penalty.value_or(d.frequency_penalty);
  s.presence_penalty = r.presence_penalty.value_or(d.presence_penalty);
  s.seed = r.seed.value_or(fresh_seed);
  s.logit_bias = r.logit_bias;
  return s;
}

namespace {

// The grammar sampler, prefilled; null when llama.cpp refuses the grammar
// (or would parse it without end: grammar_bounds.h).
llama_sampler* GrammarSampler(const GrammarSpec& g, const llama_vocab* vocab) {
  if (!CheckRepetitionBounds(g.gbnf).ok()) return nullptr;
  llama_sampler* grammar = nullptr;
  if (g.lazy) {
    std::vector<const char*> patterns;
    for (const auto& p : g.trigger_patterns) patterns.push_back(p.c_str());
    grammar = llama_sampler_init_grammar_lazy_patterns(vocab, g.gbnf.c_str(), "root", patterns.data(), patterns.size(),
                                                       g.trigger_tokens.data(), g.trigger_tokens.size());
  } else {
    grammar = llama_sampler_init_grammar(vocab, g.gbnf.c_str(), "root");
  }
  if (!grammar) return nullptr;
  try {
    for (int32_t t : g.prefill) llama_sampler_accept(grammar, t);
  } catch (const std::exception&) {
    llama_sampler_free(grammar);
    return nullptr;
  }
  return grammar;
}

}  // namespace

llama_sampler* BuildSamplerChain(const SamplerSettings& s, const llama_vocab* vocab, const std::vector<int32_t>* banned) {
  auto params = llama_sampler_chain_default_params();
  params.no_perf = true;
  llama_sampler* chain = llama_sampler_chain_init(params);
  const int32_t n_vocab = llama_vocab_n_tokens(vocab);
  std::vector<llama_logit_bias> bias;
  for (const auto& b : s.logit_bias) {
    if (b.token >= 0 && b.token < n_vocab) bias.push_back({b.token, b.bias});  // checked before; never trusted
  }
  if (banned) {
    for (int32_t t : *banned) {
      if (t >= 0 && t < n_vocab) bias.push_back({t, -INFINITY});
    }
  }
  if (!bias.empty()) {
    llama_sampler_chain_add(chain, llama_sampler_init_logit_bias(n_vocab, static_cast<int32_t>(bias.size()), bias.data()));
  }
  if (!s.grammar.empty()) {
    llama_sampler* grammar = GrammarSampler(s.grammar, vocab);
    if (!grammar) {
      llama_sampler_free(chain);
      return nullptr;
    }
    llama_sampler_chain_add(chain, grammar);
  }
  if (s.repeat_penalty != 1.0f || s.frequency_penalty != 0.0f || s.presence_penalty != 0.0f) {
    llama_sampler_chain_add(chain, llama_sampler_init_penalties(n_vocab, s.repeat_last_n,
                                                                s.repeat_penalty, s.frequency_penalty,
                                                                s.presence_penalty));
  }
  if (s.temperature <= 0.0f) {
    llama_sampler_chain_add(chain, llama_sampler_init_greedy());
    return chain;
  }
  if (s.top_k > 0) llama_sampler_chain_add(chain, llama_sampler_init_top_k(s.top_k));
  if (s.top_p < 1.0f) llama_sampler_chain_add(chain, llama_sampler_init_top_p(s.top_p, 1));
  if (s.min_p > 0.0f) llama_sampler_chain_add(chain, llama_sampler_init_min_p(s.min_p, 1));
  llama_sampler_chain_add(chain, llama_sampler_init_temp(s.temperature));
  llama_sampler_chain_add(chain, llama_sampler_init_dist(s.seed));
  return chain;
}

Status CheckGrammar(const GrammarSpec& grammar, const llama_vocab* vocab) {
  llama_sampler* g = GrammarSampler(grammar, vocab);
  if (!g) {
    SPILLWAY_RETURN_IF_ERROR(CheckRepetitionBounds(grammar.gbnf));  // (why, when it was that: GrammarSampler refused it)
    return Status::InvalidArgument("llama.cpp rejected the grammar built for this request (tools or response_format)");
  }
  llama_sampler_free(g);
  return Status::Ok();
}

Status CheckLogitBias(const std::vector<api::TokenBias>& bias, const llama_vocab* vocab) {
  const int32_t n_vocab = llama_vocab_n_tokens(vocab);
  for (const auto& b : bias) {
    if (b.token < 0 || b.token >= n_vocab) {
      return Status::InvalidArgument("'logit_bias' names token " + std::to_string(b.token) +
                                     ", outside this model's vocabulary of " + std::to_string(n_vocab) +
                                     " tokens (ids 0 to " + std::to_string(n_vocab - 1) + ")");
    }
  }
  return Status::Ok();
}

nlohmann::json SamplingJson(const SamplerSettings& s, bool with_seed) {
  nlohmann::json j = {{"temperature", s.temperature},   {"top_p", s.top_p},
                      {"top_k", s.top_k},               {"min_p", s.min_p},
                      {"repeat_penalty", s.repeat_penalty}, {"repeat_last_n", s.repeat_last_n},
                      {"frequency_penalty", s.frequency_penalty}, {"presence_penalty", s.presence_penalty},
                      {"order", "penalties,top_k,top_p,min_p,temperature,dist"}};
  if (with_seed) j["seed"] = s.seed;
  return j;
}

}  // namespace spillway::worker
