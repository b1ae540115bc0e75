#include "common/worker_message.h"

#include "tests/catch.h"

using namespace loom;

TEST_CASE("worker message: a served rollout's address travels with it, and only when set", "[common]") {
  WorkerMessage m{.type = WorkerMessage::Type::kProgress, .jobId = "j", .attempt = 2, .rank = 0, .pid = 9, .step = 5,
                  .metrics = {{"rollout_requests_running", 3}}, .detail = "", .serviceAddress = "127.0.0.1:4321"};
  auto back = WorkerMessage::decode(m.encode());
  REQUIRE(back.isOk());
  CHECK(back->serviceAddress == "127.0.0.1:4321");
  CHECK(back->step == 5);
  CHECK(back->metrics.at("rollout_requests_running") == 3);
  m.serviceAddress.clear();
  CHECK(m.encode().find("service_address") == std::string::npos);
  CHECK(WorkerMessage::decode(m.encode())->serviceAddress.empty());
}
