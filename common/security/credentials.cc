#include "common/security/credentials.h"

#include "common/files.h"

namespace loom::security {

namespace {

class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string& header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA))
      methods->GetSendInitialMetadata()->emplace(kAuthorizationKey, header_);
    methods->Proceed();
  }

 private:
  const std::string& header_;
};

class BearerTokenFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(const std::string& token) : header_(kBearerPrefix + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(header_);
  }

 private:
  std::string header_;
};

}  // namespace

StatusOr<std::string> readPem(const std::string& path, const char* what) {
  auto text = files::readFile(path);
  if (!text.isOk()) return text.status().withContext(what);
  if (text->find("-----BEGIN ") == std::string::npos)
    return invalidArgument("{} {}: not PEM (no -----BEGIN line)", what, path);
  return text;
}

std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> tokenInterceptors(
    const std::string& token) {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!token.empty()) interceptors.push_back(std::make_unique<BearerTokenFactory>(token));
  return interceptors;
}

std::shared_ptr<grpc::Channel> makeChannel(const std::string& address, const ClientCredentials& credentials,
                                           grpc::ChannelArguments args) {
  std::shared_ptr<grpc::ChannelCredentials> channelCredentials = grpc::InsecureChannelCredentials();
  if (!credentials.caPem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = credentials.caPem;
    ssl.pem_cert_chain = credentials.certPem;
    ssl.pem_private_key = credentials.keyPem;
    channelCredentials = grpc::SslCredentials(ssl);
    if (!credentials.serverName.empty()) args.SetSslTargetNameOverride(credentials.serverName);
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, channelCredentials, args,
                                                                 tokenInterceptors(credentials.token));
}

StatusOr<std::shared_ptr<grpc::ServerCredentials>> serverCredentials(const ServerTls& tls) {
  if (!tls.enabled()) {
    if (!tls.clientCaFile.empty())
      return invalidArgument("a client CA needs TLS: give the server's certificate and key");
    return grpc::InsecureServerCredentials();
  }
  if (tls.keyFile.empty()) return invalidArgument("TLS needs the certificate's private key too");
  grpc::SslServerCredentialsOptions options(tls.clientCaFile.empty()
                                                ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain, readPem(tls.certFile, "the server certificate"));
  ASSIGN_OR_RETURN(pair.private_key, readPem(tls.keyFile, "the server key"));
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!tls.clientCaFile.empty()) {
    ASSIGN_OR_RETURN(options.pem_root_certs, readPem(tls.clientCaFile, "the client CA"));
  }
  return grpc::SslServerCredentials(options);
}

bool isLoopback(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace loom::security
