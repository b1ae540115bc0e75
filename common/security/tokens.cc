#include "common/security/tokens.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <array>
#include <sstream>

#include "common/files.h"

namespace loom::security {

std::string_view roleName(Role role) {
  switch (role) {
    case Role::kAdmin: return "admin";
    case Role::kUser: return "user";
    case Role::kNode: return "node";
  }
  return "?";
}

std::optional<Role> parseRole(std::string_view name) {
  if (name == "admin") return Role::kAdmin;
  if (name == "user") return Role::kUser;
  if (name == "node") return Role::kNode;
  return std::nullopt;
}

std::string Identity::describe() const {
  switch (role) {
    case Role::kAdmin: return fmt::format("admin {}", user);
    case Role::kNode: return user == "*" ? "a node credential" : fmt::format("node {}", user);
    case Role::kUser: break;
  }
  return fmt::format("{} (tenant {})", user, tenant);
}

StatusOr<std::string> generateToken() {
  std::array<unsigned char, 32> bytes{};
  if (RAND_bytes(bytes.data(), bytes.size()) != 1) return internalError("the random generator failed (RAND_bytes)");
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string token = "loom_";
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char b : bytes) {
    acc = (acc << 8) | b;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      token += kAlphabet[(acc >> bits) & 63];
    }
  }
  if (bits > 0) token += kAlphabet[(acc << (6 - bits)) & 63];
  return token;
}

std::string tokenHash(std::string_view token) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int length = 0;
  EVP_Digest(token.data(), token.size(), digest.data(), &length, EVP_sha256(), nullptr);
  std::string hex = "sha256:";
  for (unsigned int i = 0; i < length; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

namespace {

// User and tenant names: letters, digits and . _ - @ (no spaces: the file splits on them).
bool isName(std::string_view s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' && c != '@') return false;
  return true;
}

bool isHash(std::string_view s) {
  constexpr std::string_view kPrefix = "sha256:";
  if (s.size() != kPrefix.size() + 64 || s.substr(0, kPrefix.size()) != kPrefix) return false;
  for (char c : s.substr(kPrefix.size()))
    if (!std::isxdigit(static_cast<unsigned char>(c)) || std::isupper(static_cast<unsigned char>(c))) return false;
  return true;
}

}  // namespace

StatusOr<std::vector<TokenEntry>> parseTokensFile(std::string_view text, const std::string& fileName) {
  std::vector<TokenEntry> entries;
  std::istringstream lines{std::string(text)};
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string field; fields >> field;) f.push_back(field);
    if (f.empty()) continue;
    const std::string where = fmt::format("{} line {}", fileName, number);
    if (f.size() != 4)
      return invalidArgument("{}: {} fields; a line is \"sha256:HASH USER TENANT ROLE\"", where, f.size());
    if (!isHash(f[0]))
      return invalidArgument("{}: the first field is not \"sha256:\" and 64 lower-case hex digits (loomctl token "
                             "create writes lines)",
                             where);
    auto role = parseRole(f[3]);
    if (!role) return invalidArgument("{}: role \"{}\" is not admin, user or node", where, f[3]);
    const bool anyNode = *role == Role::kNode && f[1] == "*";
    if (!anyNode && !isName(f[1]))
      return invalidArgument("{}: user \"{}\": letters, digits and . _ - @ only{}", where, f[1],
                             *role == Role::kNode ? " (or * for any node)" : "");
    TokenEntry entry{.hash = f[0], .identity = {.user = f[1], .role = *role, .credential = "token"}};
    if (*role == Role::kUser) {
      if (f[2] == "-" || !isName(f[2]))
        return invalidArgument("{}: a user needs a tenant (letters, digits and . _ - @)", where);
      entry.identity.tenant = f[2];
    } else if (f[2] != "-") {
      return invalidArgument("{}: an {} has no tenant: write \"-\"", where, f[3]);
    }
    for (const TokenEntry& earlier : entries)
      if (earlier.hash == entry.hash) return invalidArgument("{}: the same token hash as an earlier line", where);
    entries.push_back(std::move(entry));
  }
  return entries;
}

std::string tokensFileLine(const TokenEntry& entry) {
  const Identity& id = entry.identity;
  return fmt::format("{} {} {} {}\n", entry.hash, id.user, id.tenant.empty() ? "-" : id.tenant, roleName(id.role));
}

std::string hmacSha256Hex(std::string_view key, std::string_view message) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> mac{};
  size_t length = 0;
  EVP_Q_mac(nullptr, "HMAC", nullptr, "SHA256", nullptr, key.data(), key.size(),
            reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac.data(), mac.size(), &length);
  std::string hex;
  for (size_t i = 0; i < length; ++i) hex += fmt::format("{:02x}", mac[i]);
  return hex;
}

bool constantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

StatusOr<std::string> readTokenFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, files::readFile(path));
  const auto begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return invalidArgument("token file {} is empty", path);
  const auto end = text.find_last_not_of(" \t\r\n");
  std::string token = text.substr(begin, end - begin + 1);
  if (token.find_first_of(" \t\r\n") != std::string::npos)
    return invalidArgument("token file {}: holds more than one word (a token file holds the token alone)", path);
  return token;
}

}  // namespace loom::security
