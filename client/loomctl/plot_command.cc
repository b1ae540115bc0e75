// `loomctl plot JOB_ID -o FILE.png|svg`: the job's curves from every stored metric row.
#include <map>

#include "client/loom_client.h"
#include "client/loomctl/commands.h"
#include "client/loomctl/output.h"
#include "client/plot/chart.h"
#include "common/files.h"

namespace loom::loomctl {

namespace {

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One series per metric, one point per step: a step that a restarted attempt ran again keeps the
// value it ran last.
std::vector<plot::Series> seriesOf(const std::vector<v1::Metric>& rows, const std::vector<std::string>& names) {
  std::map<std::string, std::map<int64_t, double>> byName;
  for (const auto& m : rows) byName[m.name()][m.step()] = m.value();
  std::vector<plot::Series> out;
  for (const auto& name : names) {
    plot::Series series{.name = name, .points = {}};
    for (const auto& [step, value] : byName[name]) series.points.emplace_back(static_cast<double>(step), value);
    out.push_back(std::move(series));
  }
  return out;
}

}  // namespace

int plotCommand(const GlobalOptions& g, const PlotOptions& options) {
  const bool png = endsWith(options.file, ".png");
  if (!png && !endsWith(options.file, ".svg"))
    return reportError(invalidArgument("-o {}: the picture's name must end in .png or .svg", options.file));
  client::LoomClient client(g.server, g.credentials);
  v1::ListJobMetricsRequest request;
  request.set_job_id(options.jobId);
  for (const auto& name : options.metrics) request.add_names(name);
  request.add_ranks(options.rank);
  auto rows = client.listJobMetrics(request);
  if (!rows.isOk()) return reportError(rows.status());

  plot::Figure figure{.title = fmt::format("job {} (rank {})", options.jobId, options.rank),
                      .panels = seriesOf(*rows, options.metrics)};
  std::vector<std::string> missing;
  for (const auto& series : figure.panels) {
    if (series.points.empty()) missing.push_back(series.name);
  }
  if (missing.size() == figure.panels.size())
    return reportError(notFound("job {} has no stored {} of rank {}", options.jobId, fmt::join(missing, " or "),
                                options.rank));
  const plot::Drawing drawing = plot::layout(figure);
  Status written = files::writeFileAtomic(options.file, png ? plot::toPng(drawing) : plot::toSvg(drawing));
  if (!written.isOk()) return reportError(written);
  for (const auto& name : missing) std::fprintf(stderr, "loomctl plot: job %s has no %s\n", options.jobId.c_str(), name.c_str());
  std::fprintf(stderr, "%s: %zu points of %zu metric%s\n", options.file.c_str(), rows->size(),
               figure.panels.size() - missing.size(), figure.panels.size() - missing.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace loom::loomctl
