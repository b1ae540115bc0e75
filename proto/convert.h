#pragma once

#include <grpcpp/support/status.h>

#include "common/node_messages.h"
#include "common/status.h"
#include "loom/v1/node.pb.h"
#include "loom/v1/plan.pb.h"
#include "loom/v1/rollout.pb.h"
#include "planner/plan.h"

// Translation between wire messages and plain structs (the node protocol's and the Plan): the
// one place that knows both.
namespace loom::convert {

// Status codes are gRPC's numbers; the message travels as is.
grpc::Status toGrpc(const Status& status);
Status fromGrpc(const grpc::Status& status);

v1::Plan toProto(const planner::Plan& in);
planner::Plan fromProto(const v1::Plan& in);

v1::RankReport toProto(const RankReport& in);
RankReport fromProto(const v1::RankReport& in);

v1::Register toProto(const NodeRegistration& in);
NodeRegistration fromProto(const v1::Register& in);

v1::MasterEndpoint toProto(const MasterEndpoint& in);
MasterEndpoint fromProto(const v1::MasterEndpoint& in);

v1::LogData toProto(const LogData& in);
LogData fromProto(const v1::LogData& in);

v1::Launch toProto(const LaunchOrder& in);
LaunchOrder fromProto(const v1::Launch& in);

v1::Kill toProto(const KillOrder& in);
KillOrder fromProto(const v1::Kill& in);

v1::Release toProto(const ReleaseOrder& in);
ReleaseOrder fromProto(const v1::Release& in);

v1::LogRequest toProto(const LogQuery& in);
LogQuery fromProto(const v1::LogRequest& in);

// Folds `next` into `into`, both waiting to be written on a Generate stream, sample by sample;
// false (nothing moved) when they come from different weights.
bool mergeGenerateResponses(v1::GenerateResponse& into, v1::GenerateResponse& next);

}  // namespace loom::convert
