#include "worker/report_client.h"

#include <chrono>
#include <cstdio>
#include <cstring>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/worker_message.h"

namespace loom::worker {

namespace {

int64_t steadyMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

StatusOr<std::unique_ptr<ReportClient>> ReportClient::connect(const RankContext& context) {
  sockaddr_un addr{};
  if (context.reportSocket.size() >= sizeof(addr.sun_path))
    return invalidArgument("LOOM_REPORT_SOCKET: path too long: {}", context.reportSocket);
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errnoStatus("socket");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, context.reportSocket.c_str(), context.reportSocket.size() + 1);
  // connect() on a datagram socket only fixes the destination; it succeeds while loomd is away
  // only if the path exists, so failures here and later are handled the same way: by retrying.
  ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  return std::unique_ptr<ReportClient>(new ReportClient(context, fd));
}

ReportClient::ReportClient(const RankContext& context, int fd)
    : context_(context), fd_(fd), lastDeliveredMs_(steadyMs()) {
  orphanTimeoutMs_ = std::max<int64_t>(60'000, context.heartbeatMs * 40);
  heartbeat_ = std::thread([this] { heartbeatLoop(); });
}

ReportClient::~ReportClient() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  ::close(fd_);
}

bool ReportClient::send(WorkerMessage message) {
  {
    std::lock_guard lock(mu_);
    message.serviceAddress = serviceAddress_;
  }
  const std::string datagram = message.encode();
  if (::send(fd_, datagram.data(), datagram.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(datagram.size())) {
    std::lock_guard lock(mu_);
    lastDeliveredMs_ = steadyMs();
    return true;
  }
  // The daemon may have restarted (a new socket at the same path): reconnect for the next send.
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, context_.reportSocket.c_str(), context_.reportSocket.size() + 1);
  ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  return false;
}

void ReportClient::ready(const std::string& detail) {
  WorkerMessage m{.type = WorkerMessage::Type::kReady, .jobId = context_.jobId, .attempt = context_.attempt,
                  .rank = context_.rank, .pid = ::getpid(), .step = 0, .metrics = {}, .detail = detail};
  send(std::move(m));
}

void ReportClient::progress(int64_t step, const std::map<std::string, double>& metrics) {
  WorkerMessage m{.type = WorkerMessage::Type::kProgress, .jobId = context_.jobId, .attempt = context_.attempt,
                  .rank = context_.rank, .pid = ::getpid(), .step = step, .metrics = metrics, .detail = ""};
  send(std::move(m));
}

namespace {
constexpr size_t kMaxDetail = 2000;  // a datagram, and one line of the job's reason
std::string clipped(const std::string& text) {
  return text.size() > kMaxDetail ? text.substr(0, kMaxDetail) + "..." : text;
}
}  // namespace

void ReportClient::notice(const std::string& what) {
  WorkerMessage m{.type = WorkerMessage::Type::kProgress, .jobId = context_.jobId, .attempt = context_.attempt,
                  .rank = context_.rank, .pid = ::getpid(), .step = 0, .metrics = {}, .detail = clipped(what)};
  send(std::move(m));
}

void ReportClient::failing(const std::string& why) {
  WorkerMessage m{.type = WorkerMessage::Type::kFailing, .jobId = context_.jobId, .attempt = context_.attempt,
                  .rank = context_.rank, .pid = ::getpid(), .step = 0, .metrics = {}, .detail = clipped(why)};
  send(std::move(m));
}

void ReportClient::serving(const std::string& address) {
  {
    std::lock_guard lock(mu_);
    serviceAddress_ = address;
  }
  ready("");
}

void ReportClient::heartbeatLoop() {
  const WorkerMessage beat{.type = WorkerMessage::Type::kHeartbeat, .jobId = context_.jobId,
                           .attempt = context_.attempt, .rank = context_.rank, .pid = ::getpid(),
                           .step = 0, .metrics = {}, .detail = "", .serviceAddress = ""};
  std::unique_lock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    send(beat);
    lock.lock();
    if (steadyMs() - lastDeliveredMs_ > orphanTimeoutMs_) {
      std::fprintf(stderr, "loom-worker: rank %d: loomd unreachable for %lld s; exiting (orphaned)\n", context_.rank,
                   static_cast<long long>((steadyMs() - lastDeliveredMs_) / 1000));
      std::fflush(stderr);
      ::_exit(3);
    }
    cv_.wait_for(lock, std::chrono::milliseconds(context_.heartbeatMs), [this] { return stopping_; });
  }
}

}  // namespace loom::worker
