#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace loom::checkpoint {

// A checkpoint tag directory's manifest.json: every file's size and CRC-32, written last, so that
// a reader knows the directory is whole and its files are what was written.
StatusOr<uint32_t> crc32OfFile(const std::string& path);
// Writes `dir`/manifest.json over every regular file in `dir` (tag: the checkpoint's tag).
Status writeManifest(const std::string& dir, const std::string& tag);
// DataLoss naming the file that is missing, of another size, or whose CRC-32 differs. `only`, when
// not empty, names the files to check (each must be listed): a reader of the weights alone need
// not read the optimizer state's gigabytes.
Status checkManifest(const std::string& dir, const std::vector<std::string>& only = {});

// `latest` in `checkpointDir`: the tag it names (trailing whitespace removed); NotFound when absent.
StatusOr<std::string> readLatestTag(const std::string& checkpointDir);

}  // namespace loom::checkpoint
