#include "planner/state_store.h"

#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include "loom/v1/plan.pb.h"
#include "proto/convert.h"

namespace loom::planner {

using nlohmann::json;

namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  request_id TEXT UNIQUE,
  spec_json TEXT NOT NULL,
  state INTEGER NOT NULL,
  reason TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  restarts INTEGER NOT NULL,
  create_time_ms INTEGER NOT NULL,
  update_time_ms INTEGER NOT NULL,
  ranks_json TEXT NOT NULL,
  metrics_json TEXT NOT NULL,
  last_event_seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
  job_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  time_ms INTEGER NOT NULL,
  state INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  reason TEXT NOT NULL,
  PRIMARY KEY (job_id, seq)
);
CREATE TABLE IF NOT EXISTS metrics (
  job_id TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  step INTEGER NOT NULL,
  name TEXT NOT NULL,
  value REAL NOT NULL,
  time_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS metrics_by_job ON metrics (job_id);
CREATE TABLE IF NOT EXISTS cordons (
  node_id TEXT PRIMARY KEY,
  reason TEXT NOT NULL,
  time_ms INTEGER NOT NULL
);
)sql";

// A prepared statement that finalizes itself; or, made from one the store keeps prepared
// (StateStore::prepared), that only resets it for the next use.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  explicit Statement(sqlite3_stmt* kept) : stmt_(kept), rc_(kept ? SQLITE_OK : SQLITE_ERROR), kept_(true) {}
  ~Statement() {
    if (!kept_) {
      sqlite3_finalize(stmt_);
    } else if (stmt_) {
      reset();
    }
  }
  bool prepared() const { return rc_ == SQLITE_OK; }
  void bind(int i, const std::string& s) { sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT); }
  void bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void bind(int i, double v) { sqlite3_bind_double(stmt_, i, v); }
  void bindNull(int i) { sqlite3_bind_null(stmt_, i); }
  void bindBlob(int i, const std::string& b) {
    sqlite3_bind_blob(stmt_, i, b.data(), static_cast<int>(b.size()), SQLITE_TRANSIENT);
  }
  bool isNull(int i) { return sqlite3_column_type(stmt_, i) == SQLITE_NULL; }
  std::string blob(int i) {
    const void* b = sqlite3_column_blob(stmt_, i);
    return b ? std::string(static_cast<const char*>(b), sqlite3_column_bytes(stmt_, i)) : std::string();
  }
  // The index of a named parameter (":id"), 0 when the statement does not use it.
  int index(const char* name) { return sqlite3_bind_parameter_index(stmt_, name); }
  int step() { return sqlite3_step(stmt_); }
  void reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  std::string text(int i) {
    const unsigned char* t = sqlite3_column_text(stmt_, i);
    return t ? std::string(reinterpret_cast<const char*>(t), sqlite3_column_bytes(stmt_, i)) : std::string();
  }
  int64_t int64(int i) { return sqlite3_column_int64(stmt_, i); }
  double real(int i) { return sqlite3_column_double(stmt_, i); }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
  bool kept_ = false;
};

Status sqliteError(sqlite3* db, const std::string& what) {
  int code = sqlite3_extended_errcode(db);
  StatusCode sc = (code == SQLITE_CONSTRAINT_UNIQUE || code == SQLITE_CONSTRAINT_PRIMARYKEY)
                      ? StatusCode::kAlreadyExists
                      : StatusCode::kInternal;
  return {sc, what + ": " + sqlite3_errmsg(db)};
}

// "?,?,?" for an IN list of n values.
std::string placeholders(size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += i ? ",?" : "?";
  return out;
}

json ranksToJson(const std::vector<RankStatus>& ranks) {
  json out = json::array();
  for (const auto& r : ranks) {
    out.push_back({{"rank", r.rank}, {"node", r.nodeId}, {"pid", r.pid}, {"state", static_cast<int>(r.state)},
                   {"exit_code", r.exitCode}, {"signal", r.signal}, {"detail", r.detail}, {"step", r.step},
                   {"service_address", r.serviceAddress}});
  }
  return out;
}

std::vector<RankStatus> ranksFromJson(const json& in) {
  std::vector<RankStatus> out;
  for (const auto& j : in) {
    out.push_back(RankStatus{.rank = j.at("rank"), .nodeId = j.at("node"), .pid = j.at("pid"),
                             .state = static_cast<RankState>(j.at("state").get<int>()), .exitCode = j.at("exit_code"),
                             .signal = j.at("signal"), .detail = j.at("detail"), .step = j.at("step"),
                             .serviceAddress = j.value("service_address", std::string())});
  }
  return out;
}

// One write, all or nothing: rolls back unless commit() was reached. Inside a group (see
// StateStore::groupCommits) it is a savepoint: commit() releases it into the group, and a failed
// write undoes itself alone.
class Transaction {
 public:
  Transaction(sqlite3* db, bool inGroup) : db_(db), inGroup_(inGroup) {
    ok_ = sqlite3_exec(db, inGroup ? "SAVEPOINT write" : "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) == SQLITE_OK;
  }
  // Checked before writing: a write outside a transaction would commit on its own.
  Status began() const { return ok_ ? Status::ok() : sqliteError(db_, "begin transaction"); }
  ~Transaction() {
    if (!ok_ || committed_) return;
    sqlite3_exec(db_, inGroup_ ? "ROLLBACK TO write; RELEASE write" : "ROLLBACK", nullptr, nullptr, nullptr);
  }
  Status commit() {
    if (!ok_) return sqliteError(db_, "begin transaction");
    if (sqlite3_exec(db_, inGroup_ ? "RELEASE write" : "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK)
      return sqliteError(db_, "commit");
    committed_ = true;
    return Status::ok();
  }

 private:
  sqlite3* db_;
  bool inGroup_;
  bool ok_ = false;
  bool committed_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<StateStore>> StateStore::open(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr) !=
      SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return Status(StatusCode::kInternal, "cannot open state database " + path + ": " + msg);
  }
  std::unique_ptr<StateStore> store(new StateStore(db));
  sqlite3_busy_timeout(db, 5000);
  RETURN_IF_ERROR(store->exec("PRAGMA journal_mode=WAL").withContext(path));
  RETURN_IF_ERROR(store->exec("PRAGMA synchronous=NORMAL").withContext(path));
  RETURN_IF_ERROR(store->exec(kSchema).withContext(path));
  RETURN_IF_ERROR(store->migrate().withContext(path));
  return store;
}

// Columns added after the first schema, added to a database that lacks them (one written by an
// earlier planner): jobs.plan, the compiled Plan (NULL for probe jobs and jobs stored before);
// jobs.preemptions and jobs.preempted_attempt (JobRecord's); jobs.tenant and jobs.owner (who
// submitted it: a job stored before they existed belongs to no tenant, an admin's).
Status StateStore::migrate() {
  struct Added {
    const char* name;
    const char* definition;
  };
  constexpr Added kAdded[] = {{"plan", "plan BLOB"},
                              {"preemptions", "preemptions INTEGER NOT NULL DEFAULT 0"},
                              {"preempted_attempt", "preempted_attempt INTEGER NOT NULL DEFAULT 0"},
                              {"tenant", "tenant TEXT NOT NULL DEFAULT ''"},
                              {"owner", "owner TEXT NOT NULL DEFAULT ''"}};
  for (const Added& column : kAdded) {
    Statement st(db_, "SELECT 1 FROM pragma_table_info('jobs') WHERE name = ?");
    if (!st.prepared()) return sqliteError(db_, "prepare");
    st.bind(1, std::string(column.name));
    const int rc = st.step();
    if (rc == SQLITE_ROW) continue;
    if (rc != SQLITE_DONE) return sqliteError(db_, "read the jobs table's columns");
    RETURN_IF_ERROR(exec(fmt::format("ALTER TABLE jobs ADD COLUMN {}", column.definition).c_str()));
  }
  return Status::ok();
}

StateStore::~StateStore() {
  (void)commitGroup();
  for (auto& [sql, statement] : prepared_) sqlite3_finalize(statement);
  sqlite3_close(db_);
}

sqlite3_stmt* StateStore::prepared(const char* sql) {
  // Keyed by the text's address: the statements every commit runs are string literals.
  auto [it, added] = prepared_.try_emplace(sql, nullptr);
  if (added && sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &it->second, nullptr) != SQLITE_OK) {
    sqlite3_finalize(it->second);
    prepared_.erase(it);
    return nullptr;
  }
  return it->second;
}

Status StateStore::openGroupIfAsked() {
  if (!grouping_) return Status::ok();
  if (groupOpen_) {
    if (!sqlite3_get_autocommit(db_)) return Status::ok();
    // SQLite rolled the whole group back after an I/O error or a full disk: commitGroup says so.
    groupLost_ = true;
  }
  if (sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK)
    return sqliteError(db_, "begin a group of writes");
  groupOpen_ = true;
  return Status::ok();
}

Status StateStore::commitGroup() {
  if (!groupOpen_) return Status::ok();
  groupOpen_ = false;
  // SQLite ends a transaction itself after an I/O error or a full disk: what it held is gone.
  const bool lost = std::exchange(groupLost_, false) || sqlite3_get_autocommit(db_);
  if (!sqlite3_get_autocommit(db_) && sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    Status failed = sqliteError(db_, "commit a group of writes");
    // A COMMIT that fails may leave the transaction open (SQLITE_BUSY): end it, so that the next
    // group starts clean. What it held is lost, as a failed single write is.
    if (!sqlite3_get_autocommit(db_)) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return failed;
  }
  if (lost) return internalError("sqlite: an error rolled back a group of writes: the writes before it are lost");
  return Status::ok();
}

Status StateStore::exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return internalError("sqlite: {}", msg);
  }
  return Status::ok();
}

Status StateStore::writeJob(const char* sql, const JobRecord& job) {
  Statement st(prepared(sql));
  if (!st.prepared()) return sqliteError(db_, "prepare");
  // Named parameters: the INSERT and the UPDATE use different subsets of the same fields.
  auto bindText = [&](const char* name, const std::string& v) {
    if (int i = st.index(name)) st.bind(i, v);
  };
  auto bindInt = [&](const char* name, int64_t v) {
    if (int i = st.index(name)) st.bind(i, v);
  };
  bindText(":id", job.id);
  if (int i = st.index(":request_id")) {
    if (job.requestId.empty()) {
      st.bindNull(i);
    } else {
      st.bind(i, job.requestId);
    }
  }
  bindText(":spec_json", job.specJson);
  bindText(":tenant", job.tenant);
  bindText(":owner", job.owner);
  bindInt(":state", static_cast<int64_t>(job.state));
  bindText(":reason", job.reason);
  bindInt(":attempt", job.attempt);
  bindInt(":restarts", job.restarts);
  bindInt(":preemptions", job.preemptions);
  bindInt(":preempted_attempt", job.preemptedAttempt);
  bindInt(":create_time_ms", job.createTimeMs);
  bindInt(":update_time_ms", job.updateTimeMs);
  bindText(":ranks_json", ranksToJson(job.ranks).dump());
  bindText(":metrics_json", json(job.metrics).dump());
  bindInt(":last_event_seq", job.lastEventSeq);
  if (st.step() != SQLITE_DONE) return sqliteError(db_, "write job " + job.id);
  return Status::ok();
}

Status StateStore::insertEvents(const std::string& jobId, const std::vector<JobEvent>& events) {
  Statement st(prepared("INSERT INTO events (job_id, seq, time_ms, state, attempt, reason) VALUES (?,?,?,?,?,?)"));
  if (!st.prepared()) return sqliteError(db_, "prepare");
  for (const auto& e : events) {
    st.bind(1, jobId);
    st.bind(2, e.seq);
    st.bind(3, e.timeMs);
    st.bind(4, static_cast<int64_t>(e.state));
    st.bind(5, static_cast<int64_t>(e.attempt));
    st.bind(6, e.reason);
    if (st.step() != SQLITE_DONE) return sqliteError(db_, "insert event of " + jobId);
    st.reset();
  }
  return Status::ok();
}

Status StateStore::insertJob(const JobRecord& job, const std::vector<JobEvent>& events, const Plan* plan) {
  RETURN_IF_ERROR(openGroupIfAsked());
  Transaction tx(db_, groupOpen_);
  RETURN_IF_ERROR(tx.began());
  RETURN_IF_ERROR(writeJob(
      "INSERT INTO jobs (id, request_id, spec_json, tenant, owner, state, reason, attempt, restarts, preemptions, "
      "preempted_attempt, create_time_ms, update_time_ms, ranks_json, metrics_json, last_event_seq) VALUES (:id, "
      ":request_id, :spec_json, :tenant, :owner, :state, :reason, :attempt, :restarts, :preemptions, :preempted_attempt, :create_time_ms, "
      ":update_time_ms, :ranks_json, :metrics_json, :last_event_seq)",
      job));
  if (plan) {
    Statement st(db_, "UPDATE jobs SET plan=? WHERE id=?");
    if (!st.prepared()) return sqliteError(db_, "prepare");
    st.bindBlob(1, convert::toProto(*plan).SerializeAsString());
    st.bind(2, job.id);
    if (st.step() != SQLITE_DONE) return sqliteError(db_, "store the plan of " + job.id);
  }
  RETURN_IF_ERROR(insertEvents(job.id, events));
  return tx.commit();
}

Status StateStore::updateJob(const JobRecord& job, const std::vector<JobEvent>& newEvents,
                             const std::vector<Metric>& metrics) {
  RETURN_IF_ERROR(openGroupIfAsked());
  Transaction tx(db_, groupOpen_);
  RETURN_IF_ERROR(tx.began());
  RETURN_IF_ERROR(writeJob(
      "UPDATE jobs SET state=:state, reason=:reason, attempt=:attempt, restarts=:restarts, preemptions=:preemptions, "
      "preempted_attempt=:preempted_attempt, "
      "update_time_ms=:update_time_ms, ranks_json=:ranks_json, metrics_json=:metrics_json, "
      "last_event_seq=:last_event_seq WHERE id=:id",
      job));
  if (sqlite3_changes(db_) != 1) return notFound("job {} is not in the state database", job.id);
  RETURN_IF_ERROR(insertEvents(job.id, newEvents));
  RETURN_IF_ERROR(insertMetrics(job.id, metrics));
  return tx.commit();
}

Status StateStore::insertMetrics(const std::string& jobId, const std::vector<Metric>& metrics) {
  if (metrics.empty()) return Status::ok();
  Statement st(prepared("INSERT INTO metrics (job_id, attempt, rank, step, name, value, time_ms) VALUES (?,?,?,?,?,?,?)"));
  if (!st.prepared()) return sqliteError(db_, "prepare");
  for (const auto& m : metrics) {
    st.bind(1, jobId);
    st.bind(2, static_cast<int64_t>(m.attempt));
    st.bind(3, static_cast<int64_t>(m.rank));
    st.bind(4, m.step);
    st.bind(5, m.name);
    st.bind(6, m.value);
    st.bind(7, m.timeMs);
    if (st.step() != SQLITE_DONE) return sqliteError(db_, "insert metric of " + jobId);
    st.reset();
  }
  return Status::ok();
}

StatusOr<std::vector<JobRecord>> StateStore::loadJobs() {
  Statement st(db_,
               "SELECT id, request_id, spec_json, state, reason, attempt, restarts, create_time_ms, update_time_ms, "
               "ranks_json, metrics_json, last_event_seq, plan IS NOT NULL, preemptions, preempted_attempt, tenant, owner FROM jobs "
               "ORDER BY seq");
  if (!st.prepared()) return sqliteError(db_, "prepare");
  std::vector<JobRecord> jobs;
  int rc;
  while ((rc = st.step()) == SQLITE_ROW) {
    JobRecord job;
    job.id = st.text(0);
    job.requestId = st.text(1);
    job.specJson = st.text(2);
    job.state = static_cast<JobState>(st.int64(3));
    job.reason = st.text(4);
    job.attempt = static_cast<int>(st.int64(5));
    job.restarts = static_cast<int>(st.int64(6));
    job.createTimeMs = st.int64(7);
    job.updateTimeMs = st.int64(8);
    try {
      job.ranks = ranksFromJson(json::parse(st.text(9)));
      job.metrics = json::parse(st.text(10)).get<std::map<std::string, double>>();
    } catch (const json::exception& e) {
      return Status(StatusCode::kDataLoss, "job " + job.id + ": corrupt row in the state database: " + e.what());
    }
    job.lastEventSeq = st.int64(11);
    job.hasPlan = st.int64(12) != 0;
    job.preemptions = static_cast<int>(st.int64(13));
    job.preemptedAttempt = static_cast<int>(st.int64(14));
    job.tenant = st.text(15);
    job.owner = st.text(16);
    auto spec = parseJobSpec(job.specJson);
    if (!spec.isOk()) return spec.status().withContext("job " + job.id + ": stored spec");
    job.spec = std::move(spec).value();
    jobs.push_back(std::move(job));
  }
  if (rc != SQLITE_DONE) return sqliteError(db_, "load jobs");
  return jobs;
}

StatusOr<std::vector<JobEvent>> StateStore::loadEvents(const std::string& jobId) {
  Statement st(db_, "SELECT seq, time_ms, state, attempt, reason FROM events WHERE job_id=? ORDER BY seq");
  if (!st.prepared()) return sqliteError(db_, "prepare");
  st.bind(1, jobId);
  std::vector<JobEvent> events;
  int rc;
  while ((rc = st.step()) == SQLITE_ROW) {
    events.push_back(JobEvent{.seq = st.int64(0), .timeMs = st.int64(1), .state = static_cast<JobState>(st.int64(2)),
                              .attempt = static_cast<int>(st.int64(3)), .reason = st.text(4)});
  }
  if (rc != SQLITE_DONE) return sqliteError(db_, "load events of " + jobId);
  return events;
}

StatusOr<std::string> StateStore::loadPlanBytes(const std::string& jobId) {
  Statement st(db_, "SELECT plan FROM jobs WHERE id=?");
  if (!st.prepared()) return sqliteError(db_, "prepare");
  st.bind(1, jobId);
  const int rc = st.step();
  if (rc == SQLITE_DONE) return notFound("job {} does not exist", jobId);
  if (rc != SQLITE_ROW) return sqliteError(db_, "load the plan of " + jobId);
  if (st.isNull(0)) return notFound("job {} has no plan (only train, eval and rollout jobs are compiled)", jobId);
  return st.blob(0);
}

StatusOr<Plan> StateStore::loadPlan(const std::string& jobId) {
  ASSIGN_OR_RETURN(const std::string bytes, loadPlanBytes(jobId));
  v1::Plan plan;
  if (!plan.ParseFromString(bytes))
    return Status(StatusCode::kDataLoss, "job " + jobId + ": corrupt plan in the state database");
  return convert::fromProto(plan);
}

StatusOr<std::vector<Metric>> StateStore::loadMetrics(const std::string& jobId, int limit) {
  Statement st(db_,
               "SELECT attempt, rank, step, name, value, time_ms FROM (SELECT rowid, * FROM metrics WHERE job_id=? "
               "ORDER BY rowid DESC LIMIT ?) ORDER BY rowid");
  if (!st.prepared()) return sqliteError(db_, "prepare");
  st.bind(1, jobId);
  st.bind(2, static_cast<int64_t>(limit));
  std::vector<Metric> metrics;
  int rc;
  while ((rc = st.step()) == SQLITE_ROW) {
    metrics.push_back(Metric{.attempt = static_cast<int>(st.int64(0)), .rank = static_cast<int>(st.int64(1)),
                             .step = st.int64(2), .name = st.text(3), .value = st.real(4), .timeMs = st.int64(5)});
  }
  if (rc != SQLITE_DONE) return sqliteError(db_, "load metrics of " + jobId);
  return metrics;
}

StatusOr<MetricPage> StateStore::loadMetricPage(const MetricQuery& query) {
  // One row past the page says whether more are stored.
  std::string sql =
      "SELECT rowid, attempt, rank, step, name, value, time_ms FROM metrics WHERE job_id=? AND rowid>?";
  if (!query.names.empty()) sql += " AND name IN (" + placeholders(query.names.size()) + ")";
  if (!query.ranks.empty()) sql += " AND rank IN (" + placeholders(query.ranks.size()) + ")";
  sql += " ORDER BY rowid LIMIT ?";
  Statement st(db_, sql.c_str());
  if (!st.prepared()) return sqliteError(db_, "prepare");
  int i = 1;
  st.bind(i++, query.jobId);
  st.bind(i++, query.afterRow);
  for (const auto& name : query.names) st.bind(i++, name);
  for (int rank : query.ranks) st.bind(i++, static_cast<int64_t>(rank));
  st.bind(i++, static_cast<int64_t>(query.limit) + 1);
  MetricPage page{.lastRow = query.afterRow};
  int rc;
  while ((rc = st.step()) == SQLITE_ROW) {
    if (static_cast<int>(page.metrics.size()) == query.limit) {
      page.more = true;
      break;
    }
    page.lastRow = st.int64(0);
    page.metrics.push_back(Metric{.attempt = static_cast<int>(st.int64(1)), .rank = static_cast<int>(st.int64(2)),
                                  .step = st.int64(3), .name = st.text(4), .value = st.real(5),
                                  .timeMs = st.int64(6)});
  }
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) return sqliteError(db_, "load metrics of " + query.jobId);
  return page;
}

Status StateStore::putCordon(const std::string& nodeId, const std::string& reason, int64_t timeMs) {
  RETURN_IF_ERROR(openGroupIfAsked());
  Transaction tx(db_, groupOpen_);
  RETURN_IF_ERROR(tx.began());
  Statement st(db_, "INSERT OR REPLACE INTO cordons (node_id, reason, time_ms) VALUES (?,?,?)");
  if (!st.prepared()) return sqliteError(db_, "prepare");
  st.bind(1, nodeId);
  st.bind(2, reason);
  st.bind(3, timeMs);
  if (st.step() != SQLITE_DONE) return sqliteError(db_, "cordon node " + nodeId);
  return tx.commit();
}

Status StateStore::deleteCordon(const std::string& nodeId) {
  RETURN_IF_ERROR(openGroupIfAsked());
  Transaction tx(db_, groupOpen_);
  RETURN_IF_ERROR(tx.began());
  Statement st(db_, "DELETE FROM cordons WHERE node_id=?");
  if (!st.prepared()) return sqliteError(db_, "prepare");
  st.bind(1, nodeId);
  if (st.step() != SQLITE_DONE) return sqliteError(db_, "uncordon node " + nodeId);
  return tx.commit();
}

StatusOr<std::map<std::string, std::string>> StateStore::loadCordons() {
  Statement st(db_, "SELECT node_id, reason FROM cordons");
  if (!st.prepared()) return sqliteError(db_, "prepare");
  std::map<std::string, std::string> out;
  int rc;
  while ((rc = st.step()) == SQLITE_ROW) out[st.text(0)] = st.text(1);
  if (rc != SQLITE_DONE) return sqliteError(db_, "read the cordons");
  return out;
}

}  // namespace loom::planner
