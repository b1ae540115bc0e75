#include "backends/rendezvous/tcp_store.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

#include "tests/catch.h"
#include "tests/free_port.h"

using namespace loom;
using loom::testing::freePort;
using loom::backends::TcpStore;

TEST_CASE("store: set - get waits for a key - add counts", "[backends]") {
  const int port = freePort();
  auto server = TcpStore::connect({.host = "127.0.0.1", .port = port, .isServer = true});
  REQUIRE(server.isOk());
  auto client = TcpStore::connect({.host = "127.0.0.1", .port = port, .isServer = false});
  REQUIRE(client.isOk());
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (void)(*server)->set("b", std::string("\0two", 4));
  });
  REQUIRE((*client)->set("a", "one").isOk());
  auto values = (*client)->get({"a", "b"}, std::chrono::seconds(10));
  late.join();
  REQUIRE(values.isOk());
  CHECK((*values)[0] == "one");
  CHECK((*values)[1] == std::string("\0two", 4));
  CHECK((*server)->add("n", 2).value() == 2);
  CHECK((*client)->add("n", 3).value() == 5);
}

TEST_CASE("store: a missing key times out naming it - an absent server is named", "[backends]") {
  const int port = freePort();
  auto server = TcpStore::connect({.host = "127.0.0.1", .port = port, .isServer = true});
  REQUIRE(server.isOk());
  REQUIRE((*server)->set("here", "1").isOk());
  auto missing = (*server)->get({"here", "absent"}, std::chrono::milliseconds(50));
  CHECK(missing.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(missing.status().message().find("absent") != std::string::npos);
  CHECK(missing.status().message().find("here") == std::string::npos);

  auto nobody = TcpStore::connect({.host = "127.0.0.1", .port = freePort(), .isServer = false,
                                   .connectTimeout = std::chrono::milliseconds(100)});
  REQUIRE_FALSE(nobody.isOk());
  CHECK(nobody.status().message().find("cannot reach rank 0's store at 127.0.0.1:") != std::string::npos);
}
