#include "daemon/log_server.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include <fmt/format.h>

namespace loom::daemon {

namespace {

constexpr size_t kChunkBytes = 256 * 1024;
constexpr auto kFollowPoll = std::chrono::milliseconds(200);

// The byte offset where the last `lines` lines of the file begin.
size_t tailOffset(const std::string& path, int lines) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in || lines <= 0) return 0;
  std::streamoff size = in.tellg();
  std::streamoff pos = size;
  int newlines = 0;
  char c;
  // A final newline ends the last line; it does not start another.
  if (pos > 0) {
    in.seekg(pos - 1);
    in.get(c);
    if (c == '\n') --pos;
  }
  const std::streamoff block = 4096;
  std::string buf;
  while (pos > 0) {
    std::streamoff start = std::max<std::streamoff>(0, pos - block);
    buf.resize(static_cast<size_t>(pos - start));
    in.seekg(start);
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    for (std::streamoff i = static_cast<std::streamoff>(buf.size()) - 1; i >= 0; --i) {
      if (buf[static_cast<size_t>(i)] == '\n' && ++newlines == lines) return static_cast<size_t>(start + i + 1);
    }
    pos = start;
  }
  return 0;
}

}  // namespace

LogServer::LogServer(std::string jobsDir, LiveCheck isLive, Sender send)
    : jobsDir_(std::move(jobsDir)), isLive_(std::move(isLive)), send_(std::move(send)) {}

LogServer::~LogServer() {
  std::map<int64_t, std::unique_ptr<Request>> requests;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, r] : requests_) r->cancelled = true;
    requests.swap(requests_);
  }
  cv_.notify_all();
  for (auto& [id, r] : requests) {
    if (r->thread.joinable()) r->thread.join();
  }
}

std::string LogServer::logPath(const std::string& jobsDir, const std::string& jobId, int attempt, int rank) {
  return fmt::format("{}/{}/attempt-{}/rank-{}.log", jobsDir, jobId, attempt, rank);
}

void LogServer::serve(const LogQuery& query) {
  reapFinished();
  std::unique_ptr<Request> replaced;
  {
    std::lock_guard lock(mu_);
    auto it = requests_.find(query.requestId);
    if (it != requests_.end()) {
      // A planner that restarted numbers its requests anew: the old one with this id is void.
      it->second->cancelled = true;
      replaced = std::move(it->second);
      requests_.erase(it);
    }
  }
  if (replaced) {
    cv_.notify_all();
    replaced->thread.join();
  }
  std::lock_guard lock(mu_);
  auto request = std::make_unique<Request>();
  Request* raw = request.get();
  request->thread = std::thread([this, query, raw] { run(query, raw); });
  requests_[query.requestId] = std::move(request);
}

void LogServer::cancel(int64_t requestId) {
  {
    std::lock_guard lock(mu_);
    auto it = requests_.find(requestId);
    if (it != requests_.end()) it->second->cancelled = true;
  }
  cv_.notify_all();
}

void LogServer::cancelAll() {
  {
    std::lock_guard lock(mu_);
    for (auto& [id, r] : requests_) r->cancelled = true;
  }
  cv_.notify_all();
}

void LogServer::reapFinished() {
  std::vector<std::unique_ptr<Request>> done;
  {
    std::lock_guard lock(mu_);
    for (auto it = requests_.begin(); it != requests_.end();) {
      if (it->second->finished) {
        done.push_back(std::move(it->second));
        it = requests_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& r : done) r->thread.join();
}

void LogServer::run(LogQuery query, Request* request) {
  struct Source {
    int rank;
    std::string path;
    size_t offset;
  };
  std::vector<Source> sources;
  std::string dir = fmt::format("{}/{}/attempt-{}", jobsDir_, query.jobId, query.attempt);
  std::vector<int> ranks = query.ranks;
  if (ranks.empty()) {
    static const std::regex kRankFile(R"(rank-(\d+)\.log)");
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      std::smatch m;
      std::string name = entry.path().filename().string();
      if (std::regex_match(name, m, kRankFile)) ranks.push_back(std::stoi(m[1]));
    }
    std::sort(ranks.begin(), ranks.end());
  }
  for (int rank : ranks) {
    std::string path = logPath(jobsDir_, query.jobId, query.attempt, rank);
    if (!std::filesystem::exists(path)) continue;  // that rank lives on another node
    sources.push_back({rank, path, tailOffset(path, query.tailLines)});
  }

  auto drain = [&](Source& s) {
    std::ifstream in(s.path, std::ios::binary);
    if (!in) return false;
    in.seekg(static_cast<std::streamoff>(s.offset));
    std::string buf(kChunkBytes, '\0');
    bool any = false;
    while (!request->cancelled) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      std::streamsize n = in.gcount();
      if (n <= 0) break;
      s.offset += static_cast<size_t>(n);
      send_(LogData{.requestId = query.requestId, .rank = s.rank, .data = buf.substr(0, static_cast<size_t>(n)),
                    .done = false, .error = ""});
      any = true;
    }
    return any;
  };

  for (auto& s : sources) drain(s);
  while (query.follow && !request->cancelled) {
    bool anyLive = false;
    for (auto& s : sources) anyLive |= isLive_(query.jobId, query.attempt, s.rank);
    bool anyData = false;
    for (auto& s : sources) anyData |= drain(s);
    if (!anyLive && !anyData) break;  // checked liveness before the last read: nothing is lost
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, kFollowPoll, [&] { return request->cancelled.load(); });
  }
  if (!request->cancelled)
    send_(LogData{.requestId = query.requestId, .rank = 0, .data = "", .done = true, .error = ""});
  request->finished = true;
}

}  // namespace loom::daemon
