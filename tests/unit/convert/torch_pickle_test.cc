#include "worker/convert/torch_pickle.h"

#include <string>

#include "tests/catch.h"

using namespace std::string_literals;  // "...\x00..."s keeps its NUL bytes
using loom::convert::PickleValue;
using loom::convert::readTorchPickle;

namespace {

// Protocol 2 pickles written out by hand, opcode by opcode.
std::string pickle(const std::string& body) { return std::string("\x80\x02", 2) + body + "."; }

std::string unicode(const std::string& s) {
  std::string out = "X";
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((s.size() >> (8 * i)) & 0xff));
  return out + s;
}

}  // namespace

TEST_CASE("torch pickles: plain values and an OrderedDict of tensors are read as data", "[convert]") {
  // {"a": 1, "b": [True, None, 2.5]}
  std::string body = "}q\x00("s + unicode("a") + "K\x01" + unicode("b") + "](\x88NG\x40\x04\x00\x00\x00\x00\x00\x00"s +
                     "eu";
  auto v = readTorchPickle(pickle(body), "plain.pkl");
  INFO(v.status().toString());
  REQUIRE(v.isOk());
  REQUIRE((*v)->kind == PickleValue::Kind::kDict);
  CHECK((*v)->get("a")->integer == 1);
  const PickleValue* list = (*v)->get("b");
  REQUIRE(list->items.size() == 3);
  CHECK(list->items[0]->boolean);
  CHECK(list->items[1]->kind == PickleValue::Kind::kNone);
  CHECK(list->items[2]->real == 2.5);

  // OrderedDict(w=_rebuild_tensor_v2(storage('0', FloatStorage, 6 elements), 0, (2, 3), (3, 1), False, OrderedDict()))
  std::string tensor = "ccollections\nOrderedDict\n)R" + unicode("w") + "ctorch._utils\n_rebuild_tensor_v2\n(" +
                       "(" + unicode("storage") + "ctorch\nFloatStorage\n" + unicode("0") + unicode("cpu") +
                       "K\x06tQK\x00K\x02K\x03\x86K\x03K\x01\x86\x89"s "ccollections\nOrderedDict\n)RtRs";
  auto t = readTorchPickle(pickle(tensor), "tensor.pkl");
  INFO(t.status().toString());
  REQUIRE(t.isOk());
  const PickleValue* w = (*t)->get("w");
  REQUIRE(w->kind == PickleValue::Kind::kTensor);
  CHECK(w->tensor.dtype == "float32");
  CHECK(w->tensor.shape == std::vector<int64_t>{2, 3});
  CHECK(w->tensor.contiguous());
  CHECK(w->tensor.storage == "0");
}

TEST_CASE("torch pickles: an enum member pickled by name or by value reads as the same record", "[convert]") {
  // Python 3.12 (and Debian's 3.11): getattr(ZeroStageEnum, "gradients"); earlier: ZeroStageEnum(2).
  const std::string byName = "c__builtin__\ngetattr\ncdeepspeed.runtime.zero.config\nZeroStageEnum\n" +
                             unicode("gradients") + "\x86R";
  const std::string byValue = "cdeepspeed.runtime.zero.config\nZeroStageEnum\nK\x02\x85R"s;
  for (const std::string& body : {byName, byValue}) {
    auto v = readTorchPickle(pickle(body), "optim_states.pt (data.pkl)");
    INFO(v.status().toString());
    REQUIRE(v.isOk());
    CHECK((*v)->kind == PickleValue::Kind::kObject);
    CHECK((*v)->text == "deepspeed.runtime.zero.config.ZeroStageEnum");
    REQUIRE((*v)->items.size() == 1);
    CHECK((*v)->items[0]->integer == 2);
  }
  // getattr is read for those enums' members and for nothing else.
  auto error = [](const std::string& body) { return readTorchPickle(pickle(body), "f.pt").status().message(); };
  CHECK(error("c__builtin__\ngetattr\ncdeepspeed.runtime.zero.config\nZeroStageEnum\n" + unicode("mro") + "\x86R")
            .find("getattr(deepspeed.runtime.zero.config.ZeroStageEnum, \"mro\"): not a member of an enum") !=
        std::string::npos);
  CHECK(error("c__builtin__\ngetattr\nccollections\nOrderedDict\n" + unicode("fromkeys") + "\x86R")
            .find("getattr(collections.OrderedDict, \"fromkeys\"): not a member of an enum") != std::string::npos);
}

TEST_CASE("torch pickles: what is not data is refused, naming the source and the offset", "[convert]") {
  auto error = [](const std::string& bytes) { return readTorchPickle(bytes, "f.pt (data.pkl)").status().message(); };
  // os.system, as pickle writes it on Linux.
  CHECK(error(pickle("cposix\nsystem\n(" + unicode("echo hi") + "tR")) ==
        "f.pt (data.pkl): offset 2: global posix.system is not one that torch.save writes into a checkpoint: refused "
        "(nothing of a pickle runs here; the globals read are torch's tensor rebuild functions and storage types, "
        "OrderedDict, torch.Size and DeepSpeed's checkpoint records)");
  CHECK(error(("\x80\x02}q\x00(X\x05\x00\x00\x00"s + "ab")) ==
        "f.pt (data.pkl): offset 6: truncated: a string of 5 bytes, 2 left");
  CHECK(error(pickle("I01\n")) == "f.pt (data.pkl): offset 2: opcode 0x49 is not one torch.save writes (protocols 2 "
                                  "to 5, no code): refused");
  CHECK(error(std::string("\x80\x01N.", 4)) == "f.pt (data.pkl): offset 0: pickle protocol 1 (2 to 5 are read)");
  // A list that holds itself: ] BINPUT 0, BINGET 0, APPEND.
  CHECK(error(pickle("]q\x00h\x00"s + "a")) ==
        "f.pt (data.pkl): the pickle's values contain themselves (a cycle): refused");
  // A tensor that reaches past its storage of 4 elements.
  std::string past = "ctorch._utils\n_rebuild_tensor_v2\n((" + unicode("storage") + "ctorch\nFloatStorage\n" +
                     unicode("0") + unicode("cpu") + "K\x04tQK\x00K\x05\x85K\x01\x85\x89)tR"s;
  INFO(error(pickle(past)));
  CHECK(error(pickle(past)).find("tensor of shape [5] at offset 0 reaches past its storage 0 of 4 elements") !=
        std::string::npos);
  CHECK(error(pickle("0")) == "f.pt (data.pkl): offset 2: the stack is empty");
  CHECK(error("") == "f.pt (data.pkl): offset 0: truncated: 1 more bytes wanted, 0 left");
}
