// The public API's contract: status codes, field names in errors, idempotency, paging.
#include <condition_variable>

#include <grpcpp/generic/generic_stub.h>

#include "common/files.h"
#include "tests/catch.h"
#include "tests/integration/cluster.h"

using namespace loom;
using namespace loom::testing;

namespace {

void expectRejected(client::LoomClient& client, const std::string& spec, const std::string& field) {
  auto created = client.createJob(spec);
  INFO("spec: " << spec << "\nstatus: " << created.status().toString());
  REQUIRE_FALSE(created.isOk());
  CHECK(created.status().code() == StatusCode::kInvalidArgument);
  CHECK(created.status().message().find(field) != std::string::npos);
}

}  // namespace

TEST_CASE("malformed specs are INVALID_ARGUMENT naming the field - and nothing is stored", "[integration]") {
  Standalone cluster(2);
  client::LoomClient& client = *cluster.client;
  expectRejected(client, "{not json", "not valid JSON");
  expectRejected(client, "[1, 2]", "must be a JSON object");
  // A number past a double's range (found by tests/fuzz): refused, not a planner that stops.
  expectRejected(client, R"({"name": "p", "kind": "probe", "resources": {"ranks": 3e2768}})", "number overflow");
  expectRejected(client, probeSpec(2, 1, 1, {{"colour", "blue"}}), "colour: unknown key");
  // A plugin by path: a spec never chooses a library for the ranks to load.
  expectRejected(client, probeSpec(1, 1, 1, {{"kernels", {{"plugins", {"/tmp/evil/libloom_kernels_x.so"}}}}}),
                 "kernels.plugins[0]: \"/tmp/evil/libloom_kernels_x.so\" is not a plugin name");
  expectRejected(client, probeSpec(1, 1, 1, {{"kernels", {{"plugins", {"cpu", "../lib/libloom_kernels_cpu.so"}}}}}),
                 "kernels.plugins[1]");
  expectRejected(client, probeSpec(2, 1, 1, {{"probe", {{"tick_us", 3}}}}), "probe.tick_us: unknown key");
  expectRejected(client, probeSpec(0, 1, 1), "resources.ranks");
  expectRejected(client, probeSpec(-3, 1, 1), "resources.ranks");
  expectRejected(client, probeSpec(2, 1, 1, {{"kind", nullptr}}), "kind: required field is missing");
  expectRejected(client, probeSpec(2, 1, 1, {{"resources", {{"ranks", nullptr}}}}), "resources.ranks: required");
  expectRejected(client, probeSpec(2, 1, 1, {{"resources", {{"device", "tpu"}}}}), "resources.device");
  expectRejected(client, probeSpec(2, 1, 1, {{"kind", "bake"}}), "kind: \"bake\"");
  expectRejected(client, probeSpec(2, 1, 1, {{"probe", {{"ticks", "many"}}}}), "probe.ticks: must be an integer");

  auto list = client.listJobs(v1::ListJobsRequest());
  REQUIRE(list.isOk());
  CHECK(list->jobs_size() == 0);
}

TEST_CASE("CreateJob twice with one request_id creates one job", "[integration]") {
  Standalone cluster(2);
  auto first = cluster.client->createJob(probeSpec(1, 1, 1), "req-42");
  auto second = cluster.client->createJob(probeSpec(1, 1, 1), "req-42");
  REQUIRE(first.isOk());
  REQUIRE(second.isOk());
  CHECK(first->created());
  CHECK_FALSE(second->created());
  CHECK(first->job().id() == second->job().id());
  auto other = cluster.client->createJob(probeSpec(1, 1, 1), "req-43");
  REQUIRE(other.isOk());
  CHECK(other->job().id() != first->job().id());
  auto list = cluster.client->listJobs(v1::ListJobsRequest());
  CHECK(list->jobs_size() == 2);
  // The same request id with another spec is a mistake, not a retry.
  auto clash = cluster.client->createJob(probeSpec(2, 1, 1), "req-42");
  CHECK(clash.status().code() == StatusCode::kAlreadyExists);
  CHECK(clash.status().message().find("req-42") != std::string::npos);
}

TEST_CASE("CreateJob compiles a train job's plan - GetJobPlan returns it - uncompilable jobs are INVALID_ARGUMENT",
          "[integration]") {
  Standalone cluster(2);  // fewer slots than the job's ranks: it stays PENDING, nothing runs
  client::LoomClient& client = *cluster.client;
  const std::string config = cluster.dir.path() + "/config.json";
  REQUIRE(files::writeFileAtomic(config, R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2})")
              .isOk());
  nlohmann::json spec{{"name", "planned"},
                      {"kind", "train"},
                      {"resources", {{"ranks", 4}, {"device", "cpu"}}},
                      {"model", {{"config", config}}},
                      {"data", {{"train", cluster.dir.path() + "/train.tokens"}, {"seq_len", 32}}},
                      {"train", {{"steps", 1}}},
                      {"deepspeed",
                       {{"train_micro_batch_size_per_gpu", 1},
                        {"optimizer", {{"type", "AdamW"}}},
                        {"zero_optimization", {{"stage", 1}}}}}};
  auto created = client.createJob(spec.dump(), "plan-1");
  INFO(created.status().toString());
  REQUIRE(created.isOk());
  const std::string id = created->job().id();
  auto plan = client.getJobPlan(id);
  INFO(plan.status().toString());
  REQUIRE(plan.isOk());
  CHECK(plan->job_name() == "planned");
  CHECK((plan->mesh().world() == 4 && plan->mesh().dp() == 4 && plan->mesh().tp() == 1));
  CHECK(plan->groups().data(0).ranks_size() == 4);
  // embedding, 2 layers of 9 tensors, the final norm, the head
  CHECK(plan->parameters_size() == 21);
  CHECK(plan->parameters(1).name() == "model.layers.0.input_layernorm.weight");
  // ZeRO 1: one flat buffer per block (embedding, two layers, final norm and head), cut in 4.
  CHECK(plan->zero().stage() == 1);
  CHECK(plan->zero().buffers_size() == 4);
  CHECK(plan->zero().buffers(0).fragments_size() == 4);
  CHECK(plan->memory().total() > 0);
  // A retry is answered with the job already created.
  auto again = client.createJob(spec.dump(), "plan-1");
  REQUIRE(again.isOk());
  CHECK((!again->created() && again->job().id() == id));

  auto probe = client.createJob(probeSpec(4, 1, 1));
  REQUIRE(probe.isOk());
  auto none = client.getJobPlan(probe->job().id());
  CHECK(none.status().code() == StatusCode::kNotFound);
  CHECK(none.status().message().find("has no plan") != std::string::npos);
  CHECK(client.getJobPlan("nope").status().code() == StatusCode::kNotFound);

  auto patched = [&](const nlohmann::json& patch) {
    nlohmann::json s = spec;
    s.merge_patch(patch);
    return s.dump();
  };
  expectRejected(client, patched({{"model", {{"config", "/nonexistent/config.json"}}}}),
                 "model.config: cannot open /nonexistent/config.json");
  expectRejected(client,
                 patched({{"resources", {{"device", "cuda"}, {"device_memory_gb", 0.001}}},
                          {"data", {{"seq_len", 4096}}}}),  // about 9 MiB of activations
                 "resources.device_memory_gb 0.001: estimated");
  expectRejected(client, patched({{"deepspeed", {{"sequence_parallel_size", 2}}}, {"data", {{"seq_len", 31}}}}),
                 "sequence_parallel_size 2: the sequence length 31 is not a multiple of it");
  // Tensor parallelism runs, in AutoTP's default layout; a layer spec that changes it is refused.
  expectRejected(client,
                 patched({{"deepspeed",
                           {{"tensor_parallel",
                             {{"autotp_size", 2},
                              {"partition_config",
                               {{"layer_specs", {{{"patterns", {".*down_proj.weight"}}, {"partition_type", "column"}}}}}}}}}}}),
                 "model.layers.0.mlp.down_proj.weight is laid out column (dimension 0); the workers run a llama "
                 "decoder's down row (dimension 1)");
  auto tensorParallel = client.createJob(patched({{"deepspeed", {{"tensor_parallel", {{"autotp_size", 2}}}}}}));
  INFO(tensorParallel.status().toString());
  REQUIRE(tensorParallel.isOk());
  auto tpPlan = client.getJobPlan(tensorParallel->job().id());
  REQUIRE(tpPlan.isOk());
  CHECK((tpPlan->mesh().tp() == 2 && tpPlan->mesh().dp() == 2));
  // A sequence-parallel group exchanges activations in every layer: it must fit one node, and
  // the only node has 2 slots.
  auto acrossNodes = client.createJob(patched({{"deepspeed", {{"sequence_parallel_size", 4}}}}));
  CHECK(acrossNodes.status().code() == StatusCode::kFailedPrecondition);
  CHECK(acrossNodes.status().message() ==
        "deepspeed.sequence_parallel_size 4: each group of 4 ranks must lie inside one node, and the largest of the 1 "
        "attached node has 2 slots");
  auto list = client.listJobs(v1::ListJobsRequest());
  REQUIRE(list.isOk());
  CHECK(list->jobs_size() == 3);  // the train jobs and the probe
}

TEST_CASE("unknown jobs are NOT_FOUND - ListJobs pages, filters and leaves out specs unless asked", "[integration]") {
  Standalone cluster(4);
  CHECK(cluster.client->getJob("nope").status().code() == StatusCode::kNotFound);
  CHECK(cluster.client->cancelJob("nope").status().code() == StatusCode::kNotFound);
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    auto created = cluster.client->createJob(probeSpec(1, 1, 1));
    REQUIRE(created.isOk());
    ids.push_back(created->job().id());
  }
  for (const auto& id : ids) awaitFinal(*cluster.client, id);

  v1::ListJobsRequest request;
  request.set_page_size(2);
  std::vector<std::string> seen;
  do {
    auto page = cluster.client->listJobs(request);
    REQUIRE(page.isOk());
    CHECK(page->jobs_size() <= 2);
    for (const auto& j : page->jobs()) seen.push_back(j.id());
    request.set_page_token(page->next_page_token());
  } while (!request.page_token().empty());
  CHECK(seen == ids);

  v1::ListJobsRequest running;
  running.add_states(v1::RUNNING);
  CHECK(cluster.client->listJobs(running)->jobs_size() == 0);
  v1::ListJobsRequest bad;
  bad.set_page_token("garbage");
  CHECK(cluster.client->listJobs(bad).status().code() == StatusCode::kInvalidArgument);
  v1::ListJobsRequest badState;
  badState.add_states(static_cast<v1::JobState>(42));
  auto rejected = cluster.client->listJobs(badState);
  CHECK(rejected.status().code() == StatusCode::kInvalidArgument);
  CHECK(rejected.status().message().find("states") != std::string::npos);

  // A list's jobs come without their specs unless the full view is asked for.
  const auto job = cluster.client->getJob(ids[0]);
  REQUIRE(job.isOk());
  CHECK_FALSE(job->spec_json().empty());
  v1::ListJobsRequest basic;
  basic.set_page_size(1);
  auto basicPage = cluster.client->listJobs(basic);
  REQUIRE(basicPage.isOk());
  REQUIRE(basicPage->jobs_size() == 1);
  CHECK(basicPage->jobs(0).spec_json().empty());
  CHECK(basicPage->jobs(0).state() == job->state());
  CHECK(basicPage->jobs(0).ranks_size() == job->ranks_size());
  v1::ListJobsRequest full = basic;
  full.set_view(v1::JOB_VIEW_FULL);
  auto fullPage = cluster.client->listJobs(full);
  REQUIRE(fullPage.isOk());
  REQUIRE(fullPage->jobs_size() == 1);
  CHECK(fullPage->jobs(0).spec_json() == job->spec_json());
  v1::ListJobsRequest badView;
  badView.set_view(static_cast<v1::JobView>(7));
  auto refused = cluster.client->listJobs(badView);
  CHECK(refused.status().code() == StatusCode::kInvalidArgument);
  CHECK(refused.status().message() == "view: 7 is not a job view");
}

TEST_CASE("WatchJob streams state changes with reasons and metrics - then ends", "[integration]") {
  Standalone cluster(2);
  auto created = cluster.client->createJob(probeSpec(2, 3, 20));
  REQUIRE(created.isOk());
  std::vector<v1::JobState> states;
  int metrics = 0;
  REQUIRE(cluster.client
              ->watchJob(created->job().id(),
                         [&](const v1::JobUpdate& update) {
                           for (const auto& e : update.events()) {
                             CHECK_FALSE(e.reason().empty());
                             states.push_back(e.state());
                           }
                           metrics += update.metrics_size();
                           return true;
                         })
              .isOk());
  REQUIRE(!states.empty());
  CHECK(states.front() == v1::PENDING);
  CHECK(std::find(states.begin(), states.end(), v1::LAUNCHING) != states.end());
  CHECK(std::find(states.begin(), states.end(), v1::RUNNING) != states.end());
  CHECK(states.back() == v1::SUCCEEDED);
  CHECK(metrics >= 2 * 3 * 3);  // 2 ranks x 3 ticks x 3 metrics
}

TEST_CASE("the standard health service answers", "[integration]") {
  Standalone cluster(1);
  auto channel = grpc::CreateChannel(cluster.address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  // grpc.health.v1.Health/Check with an empty request: SERVING is field 1 = 1.
  grpc::ClientContext ctx;
  grpc::ByteBuffer request, response;
  grpc::Slice empty("", 0);
  request = grpc::ByteBuffer(&empty, 1);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard lock(mu);
                   status = s;
                   done = true;
                   cv.notify_one();
                 });
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return done; });
  CHECK(status.ok());
  std::vector<grpc::Slice> slices;
  REQUIRE(response.Dump(&slices).ok());
  std::string bytes;
  for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  CHECK(bytes == std::string("\x08\x01", 2));
}
