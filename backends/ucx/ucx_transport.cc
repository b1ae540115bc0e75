#include "backends/ucx/ucx_transport.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace loom::backends {

namespace {

std::string hexEncode(const void* data, size_t size) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) {
    out += kDigits[p[i] >> 4];
    out += kDigits[p[i] & 15];
  }
  return out;
}

std::string hexDecode(const std::string& hex) {
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

Status ucsError(const std::string& what, ucs_status_t status) {
  return unavailable("{}: {}", what, ucs_status_string(status));
}

}  // namespace

uint64_t makeTag(uint32_t groupId, int sourceInGroup, uint32_t sequence, uint32_t part) {
  return (uint64_t(groupId & 0xFFF) << 52) | (uint64_t(uint32_t(sourceInGroup) & 0xFFFF) << 36) |
         (uint64_t(sequence & 0xFFFFFF) << 12) | uint64_t(part & 0xFFF);
}

Status UcxOptions::validate() const {
  if (worldSize < 1) return invalidArgument("world size must be at least 1, got {}", worldSize);
  if (rank < 0 || rank >= worldSize) return invalidArgument("rank {} is outside the world of {}", rank, worldSize);
  if (!store && worldSize > 1) return invalidArgument("a store is needed to connect {} ranks", worldSize);
  return Status::ok();
}

StatusOr<std::shared_ptr<UcxTransport>> UcxTransport::create(const UcxOptions& options) {
  RETURN_IF_ERROR(options.validate());
  std::shared_ptr<UcxTransport> t(new UcxTransport(options));
  RETURN_IF_ERROR(t->start());
  t->thread_ = std::thread([raw = t.get()] { raw->run(); });
  return t;
}

Status UcxTransport::start() {
  ucp_config_t* config = nullptr;
  if (auto s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) return ucsError("ucp_config_read", s);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  ucs_status_t s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (s != UCS_OK) return ucsError("ucp_init", s);

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the transport thread touches the worker
  if (s = ucp_worker_create(context_, &wp, &worker_); s != UCS_OK) return ucsError("ucp_worker_create", s);

  ucp_address_t* address = nullptr;
  size_t length = 0;
  if (s = ucp_worker_get_address(worker_, &address, &length); s != UCS_OK) return ucsError("ucp_worker_get_address", s);
  std::string mine = hexEncode(address, length);
  ucp_worker_release_address(worker_, address);

  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  host_ = host;
  const int n = options_.worldSize;
  peerAddresses_.assign(n, "");
  peerHosts_.assign(n, "");
  endpoints_.assign(n, nullptr);
  peerAddresses_[options_.rank] = mine;
  peerHosts_[options_.rank] = host_;
  if (n == 1) return Status::ok();

  RETURN_IF_ERROR(options_.store->set(fmt::format("ucx/{}", options_.rank), host_ + " " + mine));
  std::vector<std::string> keys;
  for (int r = 0; r < n; ++r) keys.push_back(fmt::format("ucx/{}", r));
  auto values = options_.store->get(keys, options_.rendezvousTimeout);
  if (!values.isOk()) {
    if (values.status().code() == StatusCode::kDeadlineExceeded) {
      // "still missing after 60 s: ucx/2, ucx/3" -> name the ranks.
      std::string missing = values.status().message();
      auto colon = missing.find(": ");
      std::string ranks = colon == std::string::npos ? missing : missing.substr(colon + 2);
      for (size_t p; (p = ranks.find("ucx/")) != std::string::npos;) ranks.replace(p, 4, "rank ");
      return Status(StatusCode::kDeadlineExceeded,
                    fmt::format("rendezvous: {} did not join within {} s", ranks,
                                options_.rendezvousTimeout.count() / 1000.0));
    }
    return values.status().withContext("rendezvous");
  }
  for (int r = 0; r < n; ++r) {
    const std::string& v = (*values)[r];
    auto space = v.find(' ');
    peerHosts_[r] = v.substr(0, space);
    peerAddresses_[r] = hexDecode(v.substr(space + 1));
  }
  // Every rank on this host: tensors can live in memory they all map (shared_heap.h). Every rank
  // sees the same hosts, so they all try, and they all agree on the outcome; without the heap,
  // collectives go over UCX alone.
  const bool oneHost = std::all_of(peerHosts_.begin(), peerHosts_.end(), [&](const std::string& h) { return h == host_; });
  const char* off = std::getenv("LOOM_UCX_SHARED_HEAP");
  if (oneHost && !(off && std::string(off) == "0")) {
    auto heap = SharedHeap::create(*options_.store, options_.rank, n, options_.rendezvousTimeout);
    if (heap.isOk()) {
      heap_ = std::move(*heap);
    } else {
      spdlog::warn("no shared memory among the ranks of this host, collectives go over UCX messages only: {}",
                   heap.status().message());
    }
  }
  return Status::ok();
}

UcxTransport::~UcxTransport() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (size_t peer = 0; peer < endpoints_.size(); ++peer) {
    ucp_ep_h ep = endpoints_[peer];
    if (!ep) continue;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    // Forcing is allowed only with peer error handling; shared-memory endpoints flush, for at
    // most a second (a peer that is gone never confirms).
    p.flags = peerHosts_[peer] == host_ ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
    void* req = ucp_ep_close_nbx(ep, &p);
    if (UCS_PTR_IS_PTR(req)) {
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (ucp_request_check_status(req) == UCS_INPROGRESS && std::chrono::steady_clock::now() < until)
        ucp_worker_progress(worker_);
      ucp_request_free(req);
    }
  }
  if (worker_) ucp_worker_destroy(worker_);
  if (context_) ucp_cleanup(context_);
}

StatusOr<ucp_ep_h> UcxTransport::endpoint(int peer) {
  if (endpoints_[peer]) return endpoints_[peer];
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.address = reinterpret_cast<const ucp_address_t*>(peerAddresses_[peer].data());
  // UCX 1.13 uses its shared-memory transports only without peer error handling; a dead peer
  // on this host is caught by the operation deadline instead.
  ep.err_mode = peerHosts_[peer] == host_ ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
  ucp_ep_h handle = nullptr;
  if (auto s = ucp_ep_create(worker_, &ep, &handle); s != UCS_OK)
    return ucsError(fmt::format("connecting to rank {} on {}", peer, peerHosts_[peer]), s);
  endpoints_[peer] = handle;
  return handle;
}

StatusOr<UcxTransport::Request> UcxTransport::postSend(int peer, uint64_t tag, const void* buffer, size_t bytes,
                                                       std::string what) {
  ASSIGN_OR_RETURN(ucp_ep_h ep, endpoint(peer));
  ucp_request_param_t p{};
  void* req = ucp_tag_send_nbx(ep, buffer, bytes, tag, &p);
  if (UCS_PTR_IS_ERR(req)) return ucsError(what, UCS_PTR_STATUS(req));
  Request r{.handle = req, .peer = peer, .isReceive = false, .what = std::move(what), .bytes = bytes};
  if (req) inflight_.push_back(r);
  return r;
}

StatusOr<UcxTransport::Request> UcxTransport::postReceive(int peer, uint64_t tag, void* buffer, size_t bytes,
                                                          std::string what) {
  ucp_request_param_t p{};
  void* req = ucp_tag_recv_nbx(worker_, buffer, bytes, tag, ~uint64_t(0), &p);
  if (UCS_PTR_IS_ERR(req)) return ucsError(what, UCS_PTR_STATUS(req));
  Request r{.handle = req, .peer = peer, .isReceive = true, .what = std::move(what), .bytes = bytes};
  if (req) inflight_.push_back(r);
  return r;
}

void UcxTransport::forget(void* handle) {
  for (auto it = inflight_.begin(); it != inflight_.end(); ++it) {
    if (it->handle == handle) {
      inflight_.erase(it);
      return;
    }
  }
}

void UcxTransport::abandonInflight(Task& task) {
  for (auto& r : inflight_) {
    if (r.isReceive) ucp_request_cancel(worker_, r.handle);
  }
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  bool stuck = false;
  do {
    ucp_worker_progress(worker_);
    stuck = false;
    for (auto it = inflight_.begin(); it != inflight_.end();) {
      if (ucp_request_check_status(it->handle) != UCS_INPROGRESS) {
        ucp_request_free(it->handle);
        it = inflight_.erase(it);
      } else {
        stuck = true;
        ++it;
      }
    }
  } while (stuck && std::chrono::steady_clock::now() < until);
  if (stuck) abandoned_.push_back(std::move(task));  // its buffers stay valid for UCX
  inflight_.clear();
}

void UcxTransport::poll() { ucp_worker_progress(worker_); }

Status UcxTransport::flush() {
  ucp_request_param_t param{};
  void* request = ucp_worker_flush_nbx(worker_, &param);
  if (request == nullptr) return Status::ok();
  if (UCS_PTR_IS_ERR(request)) return ucsError("flushing this rank's messages", UCS_PTR_STATUS(request));
  ucs_status_t s;
  while ((s = ucp_request_check_status(request)) == UCS_INPROGRESS) {
    if (ucp_worker_progress(worker_) == 0) sched_yield();
    if (std::chrono::steady_clock::now() > deadline_) {
      ucp_request_free(request);
      return Status(StatusCode::kDeadlineExceeded, "this rank's messages of earlier operations to reach their peers");
    }
  }
  ucp_request_free(request);
  return s == UCS_OK ? Status::ok() : ucsError("flushing this rank's messages", s);
}

Status UcxTransport::waitAll(std::vector<Request>& requests) {
  size_t pending = 0;
  for (auto& r : requests) pending += r.handle != nullptr;
  uint32_t spins = 0, idle = 0;
  while (pending > 0) {
    // Busy polling is fastest while the ranks have a core each; when ranks outnumber cores a
    // spinning rank starves the peer it waits for. After a run of empty polls, give the core up.
    if (ucp_worker_progress(worker_) != 0) {
      idle = 0;
    } else if (++idle >= 64) {
      idle = 0;
      sched_yield();
    }
    for (auto& r : requests) {
      if (!r.handle) continue;
      ucs_status_t s = ucp_request_check_status(r.handle);
      if (s == UCS_INPROGRESS) continue;
      // A message of another size than expected means the ranks disagree about the tensors
      // (shapes, dtypes or splits): say so, rather than continue with half a buffer.
      size_t received = r.bytes;
      if (r.isReceive && s == UCS_OK) {
        ucp_tag_recv_info_t info{};
        if (ucp_tag_recv_request_test(r.handle, &info) == UCS_OK) received = info.length;
      }
      ucp_request_free(r.handle);
      forget(r.handle);
      r.handle = nullptr;
      --pending;
      if (s == UCS_ERR_MESSAGE_TRUNCATED || received != r.bytes) {
        std::string sent = s == UCS_ERR_MESSAGE_TRUNCATED
                               ? fmt::format("more than the {} bytes expected", r.bytes)
                               : fmt::format("{} bytes where {} were expected", received, r.bytes);
        return invalidArgument("{}: {}: rank {} sent {}; do the ranks pass tensors of the same shape and dtype (and "
                               "the same splits)?",
                               current_, r.what, r.peer, sent);
      }
      if (s != UCS_OK) return ucsError(fmt::format("{}: {}", current_, r.what), s);
    }
    if ((++spins & 0x3FF) == 0 && std::chrono::steady_clock::now() > deadline_) {
      std::string waiting;
      for (const auto& r : requests) {
        if (r.handle) waiting += (waiting.empty() ? "" : "; ") + r.what;
      }
      return overdue(waiting);
    }
  }
  return Status::ok();
}

Status UcxTransport::overdue(const std::string& waitingFor) const {
  return Status(StatusCode::kDeadlineExceeded,
                fmt::format("{}: not complete after {} s (the watchdog's timeout); still waiting for: {}", current_,
                            options_.operationTimeout.count() / 1000.0, waitingFor));
}

char* UcxTransport::scratch(int slot, size_t bytes) {
  Scratch& s = scratch_[slot];
  if (s.size < bytes) {
    s.data.reset(new char[bytes]);  // default-initialized: no zeroing pass
    s.size = bytes;
  }
  return s.data.get();
}

void UcxTransport::enqueue(std::shared_ptr<Work> work, const std::string& opName, int64_t bytes, int groupSize,
                           Body body) {
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      queue_.push_back(Task{std::move(work), opName, bytes, groupSize, std::move(body)});
      cv_.notify_one();
      return;
    }
  }
  work->complete(unavailable("{}: the communicator is shut down", work->description()));
}

void UcxTransport::run() {
  for (;;) {
    Task task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    if (!broken_.isOk()) {
      task.work->complete(Status(broken_.code(), task.work->description() +
                                                     ": not run, the communicator failed earlier: " + broken_.message()));
      continue;
    }
    current_ = task.work->description();
    auto start = std::chrono::steady_clock::now();
    deadline_ = start + options_.operationTimeout;
    Status status = task.body();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    auto work = task.work;
    if (!status.isOk()) {
      broken_ = status;
      spdlog::error("{}", status.message());
      abandonInflight(task);
    } else if (options_.logger && !task.opName.empty()) {
      options_.logger->record(task.opName, task.bytes, task.groupSize, seconds);
    }
    work->complete(status);
  }
}

}  // namespace loom::backends
