#include "client/loomctl/progress.h"

#include <algorithm>
#include <map>
#include <vector>
#include <string>

#include <fmt/format.h>
#include <unistd.h>

#include "client/loomctl/output.h"

namespace loom::loomctl {

ProgressPrinter::ProgressPrinter(std::FILE* out) : out_(out), tty_(::isatty(::fileno(out))) {}

void ProgressPrinter::onUpdate(const v1::JobUpdate& update) {
  for (const auto& event : update.events()) {
    if (lineOpen_) {
      std::fputs(tty_ ? "\r\033[K" : "\n", out_);
      lineOpen_ = false;
    }
    std::fprintf(out_, "%s\n", describeEvent(event).c_str());
  }
  if (update.job().state() == v1::RUNNING && !update.metrics().empty() && !update.job().metrics().empty())
    drawProgress(update.job());
  std::fflush(out_);
}

void ProgressPrinter::drawProgress(const v1::Job& job) {
  auto now = std::chrono::steady_clock::now();
  if (!tty_ && now - lastDraw_ < std::chrono::seconds(1)) return;
  lastDraw_ = now;
  std::map<std::string, double> metrics(job.metrics().begin(), job.metrics().end());
  double fraction = -1;
  std::string shown;
  // What a training run is watched for comes first; the rest in name order, as room allows.
  static const std::vector<std::string> kFirst{"loss", "eval_loss", "lr", "grad_norm", "tokens_per_s", "loss_scale"};
  std::vector<std::pair<std::string, double>> ordered;
  for (const auto& name : kFirst) {
    if (auto it = metrics.find(name); it != metrics.end()) ordered.emplace_back(name, it->second);
  }
  for (const auto& [name, value] : metrics) {
    if (std::find(kFirst.begin(), kFirst.end(), name) == kFirst.end()) ordered.emplace_back(name, value);
  }
  for (const auto& [name, value] : ordered) {
    bool isProgress = name == "progress" || (name.size() > 9 && name.compare(name.size() - 9, 9, ".progress") == 0);
    if (isProgress) {
      fraction = value;
      continue;
    }
    if (shown.size() < 80) shown += fmt::format("  {}={:.4g}", name, value);
  }
  int64_t step = 0;
  for (const auto& r : job.ranks()) step = std::max<int64_t>(step, r.step());
  std::string bar;
  if (fraction >= 0) {
    constexpr int kWidth = 30;
    int filled = static_cast<int>(std::min(1.0, fraction) * kWidth + 0.5);
    bar = fmt::format("[{}{}] {:3.0f}%  ", std::string(filled, '#'), std::string(kWidth - filled, '.'), fraction * 100);
  }
  std::string line = fmt::format("{}step {}{}", bar, step, shown);
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s", line.c_str());
    lineOpen_ = true;
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
}

void ProgressPrinter::finish() {
  if (lineOpen_) std::fputs("\n", out_);
  lineOpen_ = false;
  std::fflush(out_);
}

}  // namespace loom::loomctl
