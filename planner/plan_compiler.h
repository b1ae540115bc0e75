#pragma once

#include "common/status.h"
#include "planner/job_spec.h"
#include "planner/model_config.h"
#include "planner/plan.h"

namespace loom::planner {

// Compiles the Plan of a train or eval job from its spec (parsed with SpecPurpose::kPlan or kRun)
// and its model's parsed config.json: the mesh and its groups, every parameter's tensor-parallel,
// expert and ZeRO layout, and one rank's memory checked against resources.device_memory_gb. Pure
// and deterministic: the caller reads the config file (job_plan.h does, for the planner service
// and `loomctl plan`).
//
// Each decision is taken where it lives (mesh.h, tensor_parallel.h, parallel_checks.h,
// zero_partition.h, memory_estimate.h); a job they refuse is InvalidArgument with their reason:
// the world not splitting into dp x sp x tp, heads % tp, KV heads against tp, vocab % tp, the
// sequence or heads against sp, experts % ep, ep not dividing dp x sp, and the estimated memory
// above the device's (by how much, and its largest term). A probe job has no plan.
StatusOr<Plan> compilePlan(const ModelConfig& model, const JobSpec& spec);

// OK for the kinds of job that have a plan (train, eval); InvalidArgument naming the kind else.
Status checkHasPlan(const JobSpec& spec);

// OK when the workers execute every layout of `plan`: under tensor parallelism, AutoTP's default
// layout of a dense decoder (column-parallel q/k/v and gate/up, row-parallel o_proj and down_proj
// with whole biases, vocabulary-parallel embedding and head, whole norms). InvalidArgument naming
// the parameter, its layout and the one the workers run, for a layer spec that changes it.
Status checkPlanRunnable(const Plan& plan);

}  // namespace loom::planner
