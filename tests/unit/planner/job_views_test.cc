#include "planner/job_views.h"

#include <atomic>
#include <thread>

#include "tests/catch.h"

using namespace loom::planner;

namespace {
JobRecord jobOf(const std::string& id, JobState state, const std::string& tenant = "") {
  JobRecord job;
  job.id = id;
  job.state = state;
  job.tenant = tenant;
  return job;
}
bool any(const JobRecord&) { return true; }
}  // namespace

TEST_CASE("a published job is found as it was stored; a later publish replaces it in its place", "[planner]") {
  JobViews views;
  CHECK(views.find("a") == nullptr);
  JobRecord a = jobOf("a", JobState::kPending);
  views.publish(a);
  views.publish(jobOf("b", JobState::kPending));
  a.state = JobState::kRunning;  // the loop's record changes: the view does not until published
  JobView before = views.find("a");
  CHECK(before->state == JobState::kPending);
  views.publish(a);
  CHECK(views.find("a")->state == JobState::kRunning);
  CHECK(before->state == JobState::kPending);  // a reader holding the old view keeps it whole
  auto all = views.page(0, 10, any);
  REQUIRE(all.jobs.size() == 2);
  CHECK(all.jobs[0]->id == "a");  // creation order, not the order of the last publish
  CHECK(all.jobs[1]->id == "b");
  CHECK_FALSE(all.more);
}

TEST_CASE("a page of views filters, stops at its limit and says where the next one starts", "[planner]") {
  JobViews views;
  for (int i = 0; i < 5; ++i)
    views.publish(jobOf("j" + std::to_string(i), i % 2 ? JobState::kRunning : JobState::kSucceeded, i < 3 ? "t" : "u"));
  auto running = [](const JobRecord& j) { return j.state == JobState::kRunning; };
  auto first = views.page(0, 1, running);
  REQUIRE(first.jobs.size() == 1);
  CHECK(first.jobs[0]->id == "j1");
  CHECK(first.next == 2);
  CHECK(first.more);
  auto second = views.page(first.next, 1, running);
  REQUIRE(second.jobs.size() == 1);
  CHECK(second.jobs[0]->id == "j3");
  auto rest = views.page(second.next, 1, running);
  CHECK(rest.jobs.empty());
  CHECK_FALSE(rest.more);
  auto tenantU = views.page(0, 10, [](const JobRecord& j) { return j.tenant == "u"; });
  CHECK(tenantU.jobs.size() == 2);
  CHECK(views.page(7, 10, any).jobs.empty());  // past the end: an empty last page
}

TEST_CASE("readers on other threads see whole views while the loop publishes", "[planner]") {
  JobViews views;
  JobRecord job = jobOf("a", JobState::kRunning);
  job.ranks.resize(4);
  views.publish(job);
  std::atomic<bool> done{false};
  std::atomic<int> torn{0};
  std::thread reader([&] {
    while (!done) {
      JobView v = views.find("a");
      // Every rank of one view carries the same step: a view is never seen half written.
      for (const auto& r : v->ranks) torn += r.step != v->ranks.front().step;
    }
  });
  for (int step = 1; step <= 2000; ++step) {
    for (auto& r : job.ranks) r.step = step;
    views.publish(job);
  }
  done = true;
  reader.join();
  CHECK(torn == 0);
  CHECK(views.find("a")->ranks[3].step == 2000);
}
