#pragma once

#include <string>

#include <google/protobuf/message.h>

#include "common/status.h"
#include "loom/v1/job.pb.h"
#include "loom/v1/node.pb.h"

namespace loom::loomctl {

enum class OutputFormat { kHuman, kJson };

std::string toJson(const google::protobuf::Message& message);
// The same on one line (a stream's messages, one per line).
std::string toJsonLine(const google::protobuf::Message& message);
// The job as a person reads it: state, the last reason in plain words, ranks, metrics.
std::string describeJob(const v1::Job& job);
std::string jobTableHeader();
std::string jobTableRow(const v1::Job& job);
std::string describeEvent(const v1::JobEvent& event);
std::string formatTime(int64_t ms);
// Prints "loomctl: CODE: message" to stderr and returns the process exit code for it.
int reportError(const Status& status);
// The exit code for a job's final state: 0 SUCCEEDED, 1 FAILED, 3 CANCELLED.
int exitCodeFor(v1::JobState state);

}  // namespace loom::loomctl
