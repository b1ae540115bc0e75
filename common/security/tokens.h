#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace loom::security {

// What a credential may do. admin: every job and node; user: its tenant's jobs; node: attach a
// daemon, nothing else.
enum class Role { kAdmin, kUser, kNode };
std::string_view roleName(Role role);
std::optional<Role> parseRole(std::string_view name);

// Who makes a call, as a bearer token or a client certificate names it.
struct Identity {
  std::string user;    // a person, a service or (role node) a node id; "*": any node
  std::string tenant;  // whose jobs a user sees; empty for admins and nodes
  Role role = Role::kUser;
  std::string credential;  // "token", "certificate" or "generated token": for messages and logs

  // "alice (tenant team-a)", "admin", "node n1": how messages name the caller.
  std::string describe() const;
};

// A new bearer token: "loom_" and 43 URL-safe base64 characters (32 random bytes).
StatusOr<std::string> generateToken();
// "sha256:" and the SHA-256 of the token in hex: what a tokens file stores instead of the token.
std::string tokenHash(std::string_view token);

struct TokenEntry {
  std::string hash;  // tokenHash() of the token
  Identity identity;
};

// A tokens file, one credential per line:
//   sha256:<64 hex digits>  USER  TENANT  ROLE
// TENANT is "-" for admins and nodes (and required for users); ROLE is admin, user or node. '#'
// starts a comment; blank lines are skipped. Errors name the file and the line.
StatusOr<std::vector<TokenEntry>> parseTokensFile(std::string_view text, const std::string& fileName);
// One line of the tokens file for `entry`, newline included.
std::string tokensFileLine(const TokenEntry& entry);

// HMAC-SHA256 of `message` under `key`, in hex: a credential the planner derives for one job's
// attempt instead of storing it.
std::string hmacSha256Hex(std::string_view key, std::string_view message);
// Equal strings, compared in time that does not depend on where they differ.
bool constantTimeEquals(std::string_view a, std::string_view b);

// A token read from a file (surrounding whitespace dropped); errors name the file.
StatusOr<std::string> readTokenFile(const std::string& path);

}  // namespace loom::security
