#include "admission/admission.h"

#include <gtest/gtest.h>

namespace spillway::admission {
namespace {

PlacementView Gpu(uint32_t total, uint32_t free, uint32_t slots = 2, double wait = 1) {
  return {"sim:0/99", true, false, false, total, free, slots, wait};
}
PlacementView Cpu(uint32_t total, uint32_t free, uint32_t slots = 1) {
  return {"cpu", true, false, true, total, free, slots, 2};
}
PlacementView Hybrid(uint32_t total, uint32_t free) { return {"sim:0/8", true, true, false, total, free, 1, 1}; }

TEST(AdmissionTest, AdmitWhenItFits) {
  auto d = Decide({100, 200}, {Gpu(4096, 4096)}, {});
  EXPECT_EQ(d.kind, Kind::kAdmit);
  EXPECT_EQ(d.placement, 0u);
  EXPECT_EQ(d.max_tokens, 200u);
}

// An Ollama request's num_predict is an upper bound: lowered to the room
// beside the prompt where it can run, never refused for it.
TEST(AdmissionTest, AFitContextRequestIsLoweredToTheRoomWhereItCanRun) {
  RequestNeed r{5, 4096};
  r.fit_context = true;
  auto d = Decide(r, {Gpu(128, 128), Cpu(64, 64)}, {});
  EXPECT_EQ(d.kind, Kind::kAdmit);
  EXPECT_EQ(d.placement, 0u);
  EXPECT_EQ(d.max_tokens, 123u);
  // The accelerator out: the CPU's room, not the accelerator's (which would not fit there).
  PlacementView gone = Gpu(128, 128);
  gone.usable = false;
  d = Decide(r, {gone, Cpu(64, 64)}, {});
  EXPECT_EQ(d.placement, 1u) << d.reason;
  EXPECT_EQ(d.max_tokens, 59u) << d.reason;
  // A long prompt: the larger pool's room.
  r.prompt_tokens = 120;
  d = Decide(r, {Gpu(128, 128), Cpu(1024, 1024)}, {});
  EXPECT_EQ(d.placement, 1u) << d.reason;
  EXPECT_EQ(d.max_tokens, 904u);
  // A prompt no pool holds: refused with the shortest answer it may be
  // given, not the cap it asked (which its client never sent).
  r.prompt_tokens = 2000;
  d = Decide(r, {Gpu(128, 128), Cpu(1024, 1024)}, {});
  EXPECT_EQ(d.kind, Kind::kReject);
  EXPECT_EQ(d.http_status, 413);
  EXPECT_NE(d.reason.find("the prompt (2000 tokens) + the shortest answer (16 tokens) = 2016 cells"), std::string::npos)
      << d.reason;
  // Without the flag: refused as ever (OpenAI's contract).
  r.fit_context = false;
  r.prompt_tokens = 5;
  EXPECT_EQ(Decide(r, {Gpu(128, 128)}, {}).kind, Kind::kReject);
}

// The CPU path gives at most cpu_path.max_tokens: a request is judged there
// by what it would hold, capped (the cap is applied and told when it goes).
// It was judged by what it asked, and refused as one that could never fit.
TEST(AdmissionTest, TheCpuPathIsJudgedByTheTokensItWouldGiveThere) {
  PlacementView gone = Gpu(1024, 1024);
  gone.usable = false;
  PlacementView cpu = Cpu(1024, 1024);
  cpu.max_tokens_cap = 512;
  auto d = Decide({300, 2048}, {gone, cpu}, {});
  EXPECT_EQ(d.kind, Kind::kReroute) << d.reason;
  EXPECT_EQ(d.placement, 1u);
  // Its deadline is judged by the capped answer too: 300/100 + 512/20 = 28.6 s fits 40 s.
  cpu.prompt_tps = 100;
  cpu.gen_tps = 20;
  RequestNeed timed{300, 2048};
  timed.deadline_left_s = 40;
  d = Decide(timed, {gone, cpu}, {});
  EXPECT_EQ(d.kind, Kind::kReroute) << d.reason;
  cpu.max_tokens_cap = 0;
  EXPECT_EQ(Decide({300, 2048}, {gone, cpu}, {}).kind, Kind::kReject) << "uncapped, it never fits";
}

TEST(AdmissionTest, LongPromptBeyondTheGpuPoolGoesToTheLargerCpuPool) {
  auto d = Decide({6000, 500}, {Gpu(4096, 4096), Cpu(16384, 16384)}, {});
  EXPECT_EQ(d.kind, Kind::kReroute);
  EXPECT_EQ(d.placement, 1u);
  EXPECT_NE(d.reason.find("exceed"), std::string::npos) << d.reason;
}

TEST(AdmissionTest, OffloadPrefersAPlannedHybrid) {
  auto d = Decide({6000, 500}, {Gpu(4096, 4096), Cpu(16384, 16384), Hybrid(8192, 8192)}, {});
  EXPECT_EQ(d.kind, Kind::kOffload);
  EXPECT_EQ(d.placement, 2u);
}

TEST(AdmissionTest, PressureReroutesWhenAnotherPlacementHasRoom) {
  auto d = Decide({500, 500}, {Gpu(4096, 1200), Cpu(8192, 8192)}, {});
  EXPECT_EQ(d.kind, Kind::kReroute) << d.reason;
  Policy stay;
  stay.reroute_on_pressure = false;
  EXPECT_EQ(Decide({500, 500}, {Gpu(4096, 1200), Cpu(8192, 8192)}, stay).kind, Kind::kAdmit);
}

// Per-slot pools (each slot its own stream of cells, reserved whole): a
// request that fills most of a free slot presses on nothing. One for 93 % of
// an idle GPU's slot was rerouted to the CPU as "pressure". With every slot
// taken, the primary is busy and the fallback takes the request.
TEST(AdmissionTest, APerSlotPoolIsBusyWhenItsSlotsAreTakenNotUnderPressure) {
  PlacementView gpu = Gpu(1024, 1024, /*slots free=*/4);
  gpu.per_slot = true;
  EXPECT_EQ(Decide({700, 256}, {gpu, Cpu(16384, 16384)}, {}).kind, Kind::kAdmit);
  gpu.slots_free = 0;
  gpu.cells_free = 0;
  auto d = Decide({700, 256}, {gpu, Cpu(16384, 16384)}, {});
  EXPECT_EQ(d.kind, Kind::kReroute) << d.reason;
  // A shared pool is still judged by its cells.
  PlacementView shared = Gpu(1024, 1024, 4);
  EXPECT_EQ(Decide({700, 256}, {shared, Cpu(16384, 16384)}, {}).kind, Kind::kReroute);
}

TEST(AdmissionTest, DelayWhenFullAndNothingElseFits) {
  auto d = Decide({500, 500}, {Gpu(4096, 200, 2, 3.2)}, {});
  EXPECT_EQ(d.kind, Kind::kDelay);
  EXPECT_EQ(d.retry_after_s, 4);
}

TEST(AdmissionTest, ShrinkOnlyWhenAllowed) {
  RequestNeed r{500, 2000, /*allow_shrink=*/true, 16};
  auto d = Decide(r, {Gpu(4096, 1000)}, {});
  EXPECT_EQ(d.kind, Kind::kShrink);
  EXPECT_EQ(d.max_tokens, 500u);
  r.allow_shrink = false;
  EXPECT_EQ(Decide(r, {Gpu(4096, 1000)}, {}).kind, Kind::kDelay);
  // Never fits the pool at all, but would with fewer tokens:
  RequestNeed big{3000, 4000, true, 16};
  auto s = Decide(big, {Gpu(4096, 4096)}, {});
  EXPECT_EQ(s.kind, Kind::kShrink);
  EXPECT_EQ(s.max_tokens, 1096u);
}

TEST(AdmissionTest, RejectWithNumbersWhenItCanNeverFit) {
  auto d = Decide({3000, 2000}, {Gpu(4096, 4096), Cpu(4096, 4096)}, {});
  EXPECT_EQ(d.kind, Kind::kReject);
  EXPECT_EQ(d.http_status, 400);
  EXPECT_NE(d.reason.find("5000 cells can never fit"), std::string::npos) << d.reason;
  auto huge = Decide({9000, 10}, {Gpu(4096, 4096)}, {});
  EXPECT_EQ(huge.http_status, 413);
}

// 400/413 say "never": only when no pool could ever hold the request. A
// larger pool busy past max_delay_s, one that comes back (restarting, its
// breaker to probe), or a shrink the primary could take once it frees are
// "later": a wait or a 503 with Retry-After (they were a 400, which a client
// does not retry).
TEST(AdmissionTest, WhatCouldFitLaterIsNeverA400) {
  RequestNeed long_prompt{6000, 500};
  PlacementView busy_cpu = Cpu(16384, 100);
  busy_cpu.est_wait_s = 120;  // past max_delay_s (30)
  auto d = Decide(long_prompt, {Gpu(4096, 4096), busy_cpu}, {});
  EXPECT_EQ(d.kind, Kind::kReject);
  EXPECT_EQ(d.http_status, 503) << d.reason;
  EXPECT_EQ(d.retry_after_s, 120);

  PlacementView restarting_cpu = Cpu(16384, 16384);
  restarting_cpu.usable = false;
  restarting_cpu.comes_back = true;
  d = Decide(long_prompt, {Gpu(4096, 4096), restarting_cpu}, {});
  EXPECT_EQ(d.kind, Kind::kDelay) << d.reason;
  EXPECT_NE(d.reason.find("not up yet"), std::string::npos) << d.reason;
  long_prompt.waited_s = 61;  // past start_wait_s
  d = Decide(long_prompt, {Gpu(4096, 4096), restarting_cpu}, {});
  EXPECT_EQ(d.http_status, 503) << d.reason;

  RequestNeed shrinkable{3000, 4000, /*allow_shrink=*/true, 16};
  d = Decide(shrinkable, {Gpu(4096, 500, 2, 200)}, {});  // the primary is full for longer than max_delay_s
  EXPECT_EQ(d.kind, Kind::kReject);
  EXPECT_EQ(d.http_status, 503) << d.reason;

  // Never: still 400/413, with the numbers.
  EXPECT_EQ(Decide({3000, 2000}, {Gpu(4096, 4096), Cpu(4096, 4096)}, {}).http_status, 400);
  EXPECT_EQ(Decide({6000, 500}, {Gpu(4096, 4096), Cpu(4096, 4096)}, {}).http_status, 413);
}

// A request that fits the primary only shrunk, the primary full for a
// moment: it waits, as any request waits for a busy pool (it got a 503
// however soon a slot freed).
TEST(AdmissionTest, AShrinkableRequestWaitsForABrieflyFullPrimary) {
  RequestNeed shrinkable{3000, 100000, /*allow_shrink=*/true, 16};
  auto d = Decide(shrinkable, {Gpu(4096, 500, 2, 2)}, {});
  EXPECT_EQ(d.kind, Kind::kDelay) << d.reason;
  EXPECT_EQ(d.placement, 0u);
  EXPECT_EQ(d.retry_after_s, 2);
  EXPECT_NE(d.reason.find("only shrunk"), std::string::npos) << d.reason;
}

// The primary out for good (not admitted, or failed by this request), its
// GPU fallback or hybrid full for a moment: the request waits for that one
// (it got a 503 at once; an accepted request's retry failed with it).
TEST(AdmissionTest, ABusyAlternativeIsWaitedForWhenThePrimaryIsOut) {
  PlacementView gone = Gpu(4096, 4096);
  gone.usable = false;
  PlacementView hybrid = Hybrid(2048, 0);
  hybrid.slots_free = 0;
  hybrid.est_wait_s = 3;
  auto d = Decide({100, 200}, {gone, hybrid}, {});
  EXPECT_EQ(d.kind, Kind::kDelay) << d.reason;
  EXPECT_EQ(d.placement, 1u);
  EXPECT_EQ(d.retry_after_s, 3);
  hybrid.est_wait_s = 100;  // past max_delay_s: a 503
  d = Decide({100, 200}, {gone, hybrid}, {});
  EXPECT_EQ(d.kind, Kind::kReject) << d.reason;
  EXPECT_EQ(d.http_status, 503);
}

TEST(AdmissionTest, Reject503WhenTheWaitIsTooLong) {
  auto d = Decide({500, 500}, {Gpu(4096, 100, 2, 120)}, {});
  EXPECT_EQ(d.kind, Kind::kReject);
  EXPECT_EQ(d.http_status, 503);
  EXPECT_EQ(d.retry_after_s, 120);
}

TEST(AdmissionTest, UnusablePrimaryReroutesUnlessFailFast) {
  auto gpu = Gpu(4096, 4096);
  gpu.usable = false;
  EXPECT_EQ(Decide({10, 10}, {gpu, Cpu(4096, 4096)}, {}).kind, Kind::kReroute);
  Policy ff;
  ff.fail_fast = true;
  auto d = Decide({10, 10}, {gpu, Cpu(4096, 4096)}, ff);
  EXPECT_EQ(d.kind, Kind::kReject);
  EXPECT_EQ(d.http_status, 503);
}

TEST(AdmissionTest, NoSlotMeansNotNow) {
  EXPECT_EQ(Decide({10, 10}, {Gpu(4096, 4096, 0)}, {}).kind, Kind::kDelay);
  EXPECT_EQ(Decide({}, {}, {}).kind, Kind::kReject);
}

// A request the gateway took on already (a failover; one recovered after a
// restart) waits for a busy pool however long: a delay, not a 503, past
// max_delay_s. A refusal it still gets (nothing can ever hold it) keeps a
// Retry-After of max_delay_s: it was a year, the unbounded wait's.
TEST(AdmissionTest, AnAcceptedRequestWaitsPastMaxDelayAndARefusalsRetryAfterStaysBounded) {
  PlacementView failed = Gpu(4096, 4096);
  failed.usable = false;  // (it failed this request)
  const PlacementView busy_fallback = Gpu(4096, 0, 2, /*wait=*/45);
  Policy pol;
  pol.max_delay_s = 30;
  const RequestNeed need{100, 100};
  EXPECT_EQ(Decide(need, {failed, busy_fallback}, pol).kind, Kind::kReject) << "a new request past max_delay_s";
  pol.unbounded_delay = true;
  const auto d = Decide(need, {failed, busy_fallback}, pol);
  EXPECT_EQ(d.kind, Kind::kDelay) << d.reason;
  EXPECT_EQ(d.placement, 1u);
  EXPECT_EQ(Decide(need, {Gpu(4096, 0, 2, 45)}, pol).kind, Kind::kDelay) << "a busy primary, too";
  // Nowhere to go at all: still refused, with a bounded Retry-After.
  const auto refused = Decide(need, {failed, Gpu(150, 150)}, pol);
  EXPECT_EQ(refused.kind, Kind::kReject) << refused.reason;
  EXPECT_LE(refused.retry_after_s, 30) << refused.reason;
}

TEST(AdmissionTest, APrimaryThatComesBackIsWaitedForWithinTheStartWait) {
  PlacementView starting = Gpu(4096, 4096);
  starting.usable = false;
  starting.comes_back = true;
  Policy pol;
  pol.start_wait_s = 10;
  RequestNeed need{100, 100};
  need.waited_s = 3;
  auto d = Decide(need, {starting}, pol);
  EXPECT_EQ(d.kind, Kind::kDelay) << d.reason;
  EXPECT_NE(d.reason.find("not up yet"), std::string::npos) << d.reason;
  need.waited_s = 10;  // waited as long as a start may take
  EXPECT_EQ(Decide(need, {starting}, pol).kind, Kind::kReject);
  starting.comes_back = false;  // gone for good (never admitted)
  need.waited_s = 0;
  EXPECT_EQ(Decide(need, {starting}, pol).kind, Kind::kReject);
  pol.fail_fast = true;
  starting.comes_back = true;
  EXPECT_EQ(Decide(need, {starting}, pol).kind, Kind::kReject);
  // Held back only while one request probes its half-open breaker: busy,
  // waited for by a fail_fast service as a busy primary is.
  starting.probing = true;
  auto probed = Decide(need, {starting}, pol);
  EXPECT_EQ(probed.kind, Kind::kDelay) << probed.reason;
  EXPECT_NE(probed.reason.find("one request probes it first"), std::string::npos) << probed.reason;
  // One larger than the pool that fits it shrunk: waited for too (it was a
  // 400, "can never fit", while the primary was probed or restarting).
  RequestNeed shrinkable{1000, 8000, /*allow_shrink=*/true, 16};
  auto shrunk_later = Decide(shrinkable, {starting}, pol);
  EXPECT_EQ(shrunk_later.kind, Kind::kDelay) << shrunk_later.reason;
  pol.fail_fast = false;
  starting.probing = false;  // restarting
  EXPECT_EQ(Decide(shrinkable, {starting}, pol).kind, Kind::kDelay);
}

TEST(AdmissionTest, ARequestThatCannotFinishBeforeItsDeadlineIsRefusedAtOnce) {
  PlacementView gpu = Gpu(4096, 4096);
  gpu.prompt_tps = 1000;
  gpu.gen_tps = 50;
  RequestNeed need{1000, 200};  // 1 s of prompt + 4 s of generation
  need.deadline_left_s = 3;
  auto d = Decide(need, {gpu}, {});
  EXPECT_EQ(d.kind, Kind::kReject);
  EXPECT_EQ(d.http_status, 503);
  EXPECT_EQ(d.retry_after_s, 2) << "what it lacks (5 s of run, 3 left), not its run time";
  EXPECT_NE(d.reason.find("beyond the request's deadline"), std::string::npos) << d.reason;
  // A pace measured near zero (2 tokens over hours): no Retry-After of hours,
  // nor one past any integer.
  PlacementView crawling = gpu;
  crawling.gen_tps = 1e-9;
  d = Decide(need, {crawling}, {});
  EXPECT_EQ(d.kind, Kind::kReject);
  EXPECT_EQ(d.retry_after_s, 30);
  need.deadline_left_s = 6;
  EXPECT_EQ(Decide(need, {gpu}, {}).kind, Kind::kAdmit);
  gpu.gen_tps = 0;  // not measured yet: no guess
  need.deadline_left_s = 0.5;
  EXPECT_EQ(Decide(need, {gpu}, {}).kind, Kind::kAdmit);
}

// A chat's next turn: what the worker that counted its prompt holds of it in
// a slot's cache (prefix reuse) is not computed again there, so its run is
// judged by the rest. Only there: another placement computes it whole.
TEST(AdmissionTest, ACachedPromptBeginningCountsOnlyWhereItIsCached) {
  PlacementView gpu = Gpu(8192, 8192);
  gpu.prompt_tps = 1000;
  gpu.gen_tps = 50;
  RequestNeed need{5000, 50};  // 5 s of prompt + 1 s of generation
  need.deadline_left_s = 3;
  EXPECT_EQ(Decide(need, {gpu}, {}).kind, Kind::kReject);
  need.cached_tokens = 4800;  // 0.2 s of prompt left
  need.cached_at = 0;
  EXPECT_EQ(Decide(need, {gpu}, {}).kind, Kind::kAdmit);
  need.cached_at = 1;  // cached by another placement's worker
  const auto d = Decide(need, {gpu}, {});
  EXPECT_EQ(d.kind, Kind::kReject);
  EXPECT_NE(d.reason.find("for 5000 prompt"), std::string::npos) << d.reason;
  need.cached_at = 0;
  need.cached_tokens = 90000;  // (more than the prompt: all of it, no wrap-around)
  EXPECT_EQ(Decide(need, {gpu}, {}).kind, Kind::kAdmit);
}

TEST(AdmissionTest, RoomGoesToEarlierRequestsFirstExceptOnALineOfItsOwn) {
  RequestNeed need{100, 200};
  need.ahead_in_line = 2;
  auto d = Decide(need, {Gpu(4096, 4096)}, {});
  EXPECT_EQ(d.kind, Kind::kDelay);
  EXPECT_TRUE(d.behind_line);
  EXPECT_EQ(d.reason, "2 earlier requests wait ahead of it (first come, first served)");
  need.ahead_in_line = 0;  // its turn
  d = Decide(need, {Gpu(4096, 4096)}, {});
  EXPECT_EQ(d.kind, Kind::kAdmit);
  EXPECT_FALSE(d.behind_line);
  // The CPU path orders its own line: a request rerouted there is not held back here.
  PlacementView gpu = Gpu(4096, 4096);
  gpu.usable = false;
  PlacementView cpu = Cpu(4096, 4096);
  cpu.own_line = true;
  need.ahead_in_line = 3;
  d = Decide(need, {gpu, cpu}, {});
  EXPECT_EQ(d.kind, Kind::kReroute);
  EXPECT_EQ(d.placement, 1u);
  // A request refused on its own merits is refused, not delayed behind others.
  need.max_tokens = 100000;
  EXPECT_EQ(Decide(need, {Gpu(4096, 4096)}, {}).kind, Kind::kReject);
  // One that cannot finish before its deadline hears so at once, not when its turn comes.
  PlacementView measured = Gpu(4096, 4096);
  measured.prompt_tps = 1000;
  measured.gen_tps = 50;
  RequestNeed late{1000, 200};  // 5 s of work
  late.deadline_left_s = 3;
  late.ahead_in_line = 4;
  d = Decide(late, {measured}, {});
  EXPECT_EQ(d.kind, Kind::kReject);
  EXPECT_EQ(d.http_status, 503);
  EXPECT_FALSE(d.behind_line);
}

}  // namespace
}  // namespace spillway::admission
