#include "common/status.h"

#include <gtest/gtest.h>

namespace spillway {
namespace {

TEST(StatusTest, CodesMapToHttpInOnePlace) {
  EXPECT_EQ(HttpStatusFor(StatusCode::kOk), 200);
  EXPECT_EQ(HttpStatusFor(StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusFor(StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusFor(StatusCode::kConflict), 409);
  EXPECT_EQ(HttpStatusFor(StatusCode::kPayloadTooLarge), 413);
  EXPECT_EQ(HttpStatusFor(StatusCode::kUnprocessable), 422);
  EXPECT_EQ(HttpStatusFor(StatusCode::kResourceExhausted), 503);
  EXPECT_EQ(HttpStatusFor(StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusFor(StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatusFor(StatusCode::kInternal), 500);
}

TEST(StatusTest, CarriesPhaseAndRetryHint) {
  Status s = Status::ResourceExhausted("kv full").WithPhase(FailurePhase::kKv).WithRetryAfter(2);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.phase(), FailurePhase::kKv);
  EXPECT_EQ(s.retry_after_s(), 2);
  EXPECT_EQ(s.ToString(), "resource_exhausted: kv full (phase=kv)");
  EXPECT_TRUE(Status::Ok().ok());
}

TEST(StatusOrTest, HoldsValueOrError) {
  StatusOr<int> v = 5;
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 5);
  EXPECT_TRUE(v.status().ok());
  StatusOr<int> e = Status::NotFound("x");
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace spillway
