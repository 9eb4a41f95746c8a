#include "admission/wait_estimate.h"

#include <algorithm>

namespace spillway::admission {

std::optional<double> ExpectedRunS(uint32_t prompt_tokens, uint32_t max_tokens, double prompt_tps, double gen_tps) {
  if (!(gen_tps > 0)) return std::nullopt;
  // A prompt rate not measured yet (only one-token prompts so far): count it at the generation rate.
  const double ptps = prompt_tps > 0 ? prompt_tps : gen_tps;
  return prompt_tokens / ptps + max_tokens / gen_tps;
}

std::optional<double> EstimateWaitS(const PoolNow& pool, uint64_t need, uint64_t ahead_cells, uint32_t ahead_requests) {
  const bool per_slot = pool.per_slot_cells > 0;
  if (per_slot && need > pool.per_slot_cells) return std::nullopt;  // no slot holds it
  // Per slot: each request ahead, and this one, takes a slot of its own;
  // what a running request asked is not what its end frees.
  const uint64_t want = per_slot ? 0 : need + ahead_cells;
  const uint32_t slots_wanted = 1 + ahead_requests;
  if (pool.cells_free >= want && pool.slots_free >= slots_wanted) return 0.0;
  std::vector<std::pair<double, uint32_t>> frees;  // (seconds from now, cells)
  for (const auto& r : pool.running) {
    const auto run = ExpectedRunS(r.prompt_tokens, r.max_tokens, pool.prompt_tps, pool.gen_tps);
    if (!run) return std::nullopt;
    frees.emplace_back(std::max(kOverdueS, *run - r.elapsed_s), r.cells);
  }
  std::sort(frees.begin(), frees.end());
  uint64_t free = pool.cells_free;
  uint32_t slots = pool.slots_free;
  for (const auto& [at, cells] : frees) {
    free += cells;
    ++slots;
    if (free >= want && slots >= slots_wanted) return at;
  }
  return std::nullopt;  // even with everything finished the pool cannot hold it
}

}  // namespace spillway::admission
