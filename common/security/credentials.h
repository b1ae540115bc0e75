#pragma once

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>

#include "common/status.h"

namespace loom::security {

// How a client (loomctl, loomd's planner link, tests) reaches a Loom server: TLS when it holds
// the server's CA, a client certificate for mutual TLS, a bearer token. PEM texts, already read
// (credential_flags.h reads them from files).
struct ClientCredentials {
  std::string caPem;    // the CA that signed the server's certificate; empty: plain text
  std::string certPem;  // this client's certificate, with keyPem: mutual TLS
  std::string keyPem;
  std::string token;       // sent with every call as "authorization: Bearer TOKEN"
  std::string serverName;  // the name the server's certificate must carry, when the address is not it
};

// The metadata key and prefix that carry a bearer token (HTTP's, as Kubernetes and Ray use).
inline constexpr const char* kAuthorizationKey = "authorization";
inline constexpr const char* kBearerPrefix = "Bearer ";

// A channel to `address` with `credentials`.
std::shared_ptr<grpc::Channel> makeChannel(const std::string& address, const ClientCredentials& credentials,
                                           grpc::ChannelArguments args);
// A PEM file's text; errors name `what` and the file.
StatusOr<std::string> readPem(const std::string& path, const char* what);
// Client interceptors that put the bearer token on every call of a channel (none for an empty
// token): for in-process channels, which take no channel credentials.
std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> tokenInterceptors(
    const std::string& token);

// A server's TLS: its certificate and key, and the CA whose client certificates it accepts
// (mutual TLS; clients without a certificate may still use a token).
struct ServerTls {
  std::string certFile;
  std::string keyFile;
  std::string clientCaFile;
  bool enabled() const { return !certFile.empty(); }
};
// Server credentials: TLS when `tls` is enabled, plain text otherwise. Errors name the file.
StatusOr<std::shared_ptr<grpc::ServerCredentials>> serverCredentials(const ServerTls& tls);

// Whether `address` ("host:port", "[v6]:port") binds loopback only: 127.x, ::1 or localhost.
bool isLoopback(const std::string& address);

}  // namespace loom::security
