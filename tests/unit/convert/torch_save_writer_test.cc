#include "worker/convert/torch_save_writer.h"

#include <cstring>
#include <string>
#include <vector>

#include "tests/catch.h"
#include "tests/temp_dir.h"
#include "worker/convert/torch_pickle.h"
#include "worker/convert/zip_archive.h"

using loom::Status;
using loom::convert::PickleValue;
using loom::convert::SaveTensor;
using loom::convert::SaveValue;
using loom::convert::ZipArchive;
using loom::convert::ZipWriter;

// Written here, read back by Loom's own reader; tests/oracles/universal_test.py has torch.load
// (and DeepSpeed) read what the convert job writes.
TEST_CASE("torch.save files: values and tensors read back as written, data 64-byte aligned", "[convert]") {
  loom::testing::TempDir dir;
  const std::string path = dir.path() + "/fp32.pt";
  std::vector<float> weights(6);
  for (int i = 0; i < 6; ++i) weights[i] = 0.5f * static_cast<float>(i);
  const int64_t steps = 7;
  const std::vector<SaveTensor> tensors{{"float32", {2, 3}}, {"float32", {}}};
  SaveValue root = SaveValue::dict({{"param", SaveValue::tensor(0)},
                                    {"cat_dim", 0},
                                    {"step", SaveValue::tensor(1)},
                                    {"big", int64_t(1) << 40},
                                    {"negative", -3},
                                    {"lr", 1e-3},
                                    {"betas", SaveValue::tuple({0.9, 0.999})},
                                    {"empty", SaveValue::list({})},
                                    {"none", SaveValue()},
                                    {"flag", true},
                                    {0, SaveValue::dict({{"name", "model.embed_tokens.weight"}})}});
  root.set("cat_dim", 1);
  const auto status = loom::convert::writeTorchSave(path, root, tensors, [&](size_t i, const ZipWriter::Sink& sink) {
    if (i == 0) {
      // In two pieces, as a chunked copy hands them over.
      RETURN_IF_ERROR(sink(weights.data(), 8));
      return sink(weights.data() + 2, 16);
    }
    const float step = static_cast<float>(steps);
    return sink(&step, 4);
  });
  INFO(status.toString());
  REQUIRE(status.isOk());

  auto zip = ZipArchive::open(path);
  INFO(zip.status().toString());
  REQUIRE(zip.isOk());
  const loom::convert::ZipEntry* pickle = zip->find("data.pkl");
  REQUIRE(pickle);
  CHECK(pickle->name == "fp32/data.pkl");
  REQUIRE(zip->find("version"));
  CHECK(*zip->readAll(*zip->find("version")) == "3\n");
  CHECK(*zip->readAll(*zip->find("byteorder")) == "little");
  auto value = loom::convert::readTorchPickle(*zip->readAll(*pickle), "fp32.pt");
  INFO(value.status().toString());
  REQUIRE(value.isOk());
  const PickleValue& v = **value;
  CHECK(v.get("cat_dim")->integer == 1);
  CHECK(v.get("big")->integer == int64_t(1) << 40);
  CHECK(v.get("negative")->integer == -3);
  CHECK(v.get("lr")->real == 1e-3);
  CHECK(v.get("betas")->kind == PickleValue::Kind::kTuple);
  CHECK(v.get("betas")->items[1]->real == 0.999);
  CHECK(v.get("empty")->items.empty());
  CHECK(v.get("none")->kind == PickleValue::Kind::kNone);
  CHECK(v.get("flag")->boolean);
  // The int key: the dict's last pair.
  REQUIRE(v.items.size() == 22);
  CHECK(v.items[20]->integer == 0);
  CHECK(v.items[21]->get("name")->text == "model.embed_tokens.weight");

  const PickleValue* param = v.get("param");
  REQUIRE(param->kind == PickleValue::Kind::kTensor);
  CHECK(param->tensor.dtype == "float32");
  CHECK(param->tensor.shape == std::vector<int64_t>{2, 3});
  CHECK(param->tensor.stride == std::vector<int64_t>{3, 1});
  const loom::convert::ZipEntry* data = zip->find("data/" + param->tensor.storage);
  REQUIRE(data);
  CHECK(data->offset % 64 == 0);
  std::vector<float> back(6);
  REQUIRE(zip->read(*data, 0, 24, back.data()).isOk());
  CHECK(back == weights);
  CHECK(zip->readAll(*data).isOk());  // its CRC-32 as the directory says
  const PickleValue* step = v.get("step");
  REQUIRE(step->kind == PickleValue::Kind::kTensor);
  CHECK(step->tensor.shape.empty());
  float stepBack = 0;
  REQUIRE(zip->read(*zip->find("data/" + step->tensor.storage), 0, 4, &stepBack).isOk());
  CHECK(stepBack == 7.0f);
}

TEST_CASE("torch.save files: a tensor handed over with another size is an error, and no file appears", "[convert]") {
  loom::testing::TempDir dir;
  const std::string path = dir.path() + "/short.pt";
  const float one = 1;
  const auto status = loom::convert::writeTorchSave(path, SaveValue::tensor(0), {{"float32", {2}}},
                                                    [&](size_t, const ZipWriter::Sink& sink) { return sink(&one, 4); });
  REQUIRE(!status.isOk());
  CHECK(status.message().find("short/data/0: 4 bytes written, 8 expected") != std::string::npos);
  CHECK(!loom::testing::fileExists(path));
  const auto unknown = loom::convert::writeTorchSave(path, SaveValue::tensor(0), {{"complex64", {2}}},
                                                     [&](size_t, const ZipWriter::Sink&) { return Status::ok(); });
  REQUIRE(!unknown.isOk());
  CHECK(unknown.message().find("torch.save has no storage for dtype complex64") != std::string::npos);
  CHECK(!loom::testing::fileExists(path));
}

TEST_CASE("zip archives: ZIP64 records (forced for small members) read back", "[convert]") {
  loom::testing::TempDir dir;
  const std::string path = dir.path() + "/zip64.zip";
  auto zip = ZipWriter::create(path, /*zip64From=*/0);
  REQUIRE(zip.isOk());
  REQUIRE(zip->add("archive/version", "3\n").isOk());
  const std::string data(1000, 'x');
  REQUIRE(zip->add("archive/data/0", static_cast<int64_t>(data.size()), [&](const ZipWriter::Sink& sink) {
                return sink(data.data(), data.size());
              }).isOk());
  REQUIRE(zip->finish().isOk());
  auto back = ZipArchive::open(path);
  INFO(back.status().toString());
  REQUIRE(back.isOk());
  REQUIRE(back->entries().size() == 2);
  CHECK(*back->readAll(*back->find("version")) == "3\n");
  CHECK(*back->readAll(*back->find("data/0")) == data);
  CHECK(back->find("data/0")->offset % 64 == 0);
}
