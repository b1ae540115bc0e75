#include "common/security/certificates.h"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>

namespace loom::security {

namespace {

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using Key = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using BigNum = std::unique_ptr<BIGNUM, Deleter<BIGNUM, BN_free>>;

// OpenSSL's queued error as a Status: "what: reason".
Status openSslError(const std::string& what) {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  char reason[256] = "unknown error";
  if (code != 0) ERR_error_string_n(code, reason, sizeof reason);
  return internalError("{}: {}", what, reason);
}

StatusOr<std::string> bioText(BIO* bio) {
  char* data = nullptr;
  const long length = BIO_get_mem_data(bio, &data);
  if (length <= 0) return internalError("OpenSSL wrote nothing");
  return std::string(data, static_cast<size_t>(length));
}

StatusOr<std::string> pemOf(EVP_PKEY* key) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr))
    return openSslError("writing a private key");
  return bioText(bio.get());
}

StatusOr<std::string> pemOf(X509* cert) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!PEM_write_bio_X509(bio.get(), cert)) return openSslError("writing a certificate");
  return bioText(bio.get());
}

StatusOr<Cert> readCertificate(const std::string& pem) {
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Cert cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) return openSslError("reading a PEM certificate");
  return cert;
}

StatusOr<Key> readKey(const std::string& pem) {
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Key key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key) return openSslError("reading a PEM private key");
  return key;
}

StatusOr<Key> newKey() {
  Key key(EVP_EC_gen("P-256"));
  if (!key) return openSslError("generating an EC P-256 key");
  return key;
}

Status addName(X509_NAME* name, const char* field, const std::string& value) {
  if (value.empty()) return Status::ok();
  if (!X509_NAME_add_entry_by_txt(name, field, MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(value.c_str()),
                                  -1, -1, 0))
    return openSslError(fmt::format("subject {}=\"{}\"", field, value));
  return Status::ok();
}

Status addExtension(X509* cert, X509V3_CTX* ctx, int nid, const std::string& value) {
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, ctx, nid, value.c_str());
  if (!ext) return openSslError(fmt::format("extension {} = {}", OBJ_nid2sn(nid), value));
  const int added = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (!added) return openSslError(fmt::format("adding extension {}", OBJ_nid2sn(nid)));
  return Status::ok();
}

// A certificate for `key` with `subject`, valid from five minutes ago (clocks differ a little)
// for `days`, with a random 127-bit serial; signed by the caller.
StatusOr<Cert> newCertificate(EVP_PKEY* key, const CertificateSubject& subject, int days) {
  if (days < 1) return invalidArgument("a certificate must be valid for at least a day (days: {})", days);
  Cert cert(X509_new());
  X509_set_version(cert.get(), 2);
  BigNum serial(BN_new());
  if (!BN_rand(serial.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) ||
      !BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())))
    return openSslError("choosing a serial number");
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -300);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(days) * 86400);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  RETURN_IF_ERROR(addName(name, "O", subject.organization));
  RETURN_IF_ERROR(addName(name, "OU", subject.organizationalUnit));
  RETURN_IF_ERROR(addName(name, "CN", subject.commonName));
  return cert;
}

// "DNS:a,IP:127.0.0.1": an alt name is an IP address when it parses as one.
std::string altNamesValue(const std::vector<std::string>& names) {
  std::string value;
  for (const std::string& n : names) {
    ASN1_OCTET_STRING* ip = a2i_IPADDRESS(n.c_str());
    const bool isIp = ip != nullptr;
    ASN1_OCTET_STRING_free(ip);
    value += (value.empty() ? "" : ",") + std::string(isIp ? "IP:" : "DNS:") + n;
  }
  return value;
}

std::string nameField(X509_NAME* name, int nid) {
  const int index = X509_NAME_get_index_by_NID(name, nid, -1);
  if (index < 0) return "";
  ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, index));
  unsigned char* utf8 = nullptr;
  const int length = ASN1_STRING_to_UTF8(&utf8, data);
  if (length < 0) return "";
  std::string value(reinterpret_cast<char*>(utf8), static_cast<size_t>(length));
  OPENSSL_free(utf8);
  return value;
}

}  // namespace

StatusOr<PemPair> createCertificateAuthority(const std::string& commonName, int days) {
  ASSIGN_OR_RETURN(Key key, newKey());
  ASSIGN_OR_RETURN(Cert cert, newCertificate(key.get(), {.commonName = commonName}, days));
  X509_set_issuer_name(cert.get(), X509_get_subject_name(cert.get()));
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, cert.get(), cert.get(), nullptr, nullptr, 0);
  RETURN_IF_ERROR(addExtension(cert.get(), &ctx, NID_basic_constraints, "critical,CA:TRUE"));
  RETURN_IF_ERROR(addExtension(cert.get(), &ctx, NID_key_usage, "critical,keyCertSign,cRLSign"));
  RETURN_IF_ERROR(addExtension(cert.get(), &ctx, NID_subject_key_identifier, "hash"));
  if (!X509_sign(cert.get(), key.get(), EVP_sha256())) return openSslError("signing the CA certificate");
  PemPair pair;
  ASSIGN_OR_RETURN(pair.certificate, pemOf(cert.get()));
  ASSIGN_OR_RETURN(pair.privateKey, pemOf(key.get()));
  return pair;
}

StatusOr<PemPair> issueCertificate(const PemPair& ca, const CertificateRequest& request) {
  ASSIGN_OR_RETURN(Cert caCert, readCertificate(ca.certificate));
  ASSIGN_OR_RETURN(Key caKey, readKey(ca.privateKey));
  ASSIGN_OR_RETURN(Key key, newKey());
  ASSIGN_OR_RETURN(Cert cert, newCertificate(key.get(), request.subject, request.days));
  X509_set_issuer_name(cert.get(), X509_get_subject_name(caCert.get()));
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, caCert.get(), cert.get(), nullptr, nullptr, 0);
  RETURN_IF_ERROR(addExtension(cert.get(), &ctx, NID_basic_constraints, "critical,CA:FALSE"));
  RETURN_IF_ERROR(addExtension(cert.get(), &ctx, NID_key_usage, "critical,digitalSignature,keyEncipherment"));
  std::string usage;
  if (request.serverAuth) usage = "serverAuth";
  if (request.clientAuth) usage += usage.empty() ? "clientAuth" : ",clientAuth";
  if (!usage.empty()) RETURN_IF_ERROR(addExtension(cert.get(), &ctx, NID_ext_key_usage, usage));
  if (!request.altNames.empty())
    RETURN_IF_ERROR(addExtension(cert.get(), &ctx, NID_subject_alt_name, altNamesValue(request.altNames)));
  RETURN_IF_ERROR(addExtension(cert.get(), &ctx, NID_subject_key_identifier, "hash"));
  RETURN_IF_ERROR(addExtension(cert.get(), &ctx, NID_authority_key_identifier, "keyid:always"));
  if (!X509_sign(cert.get(), caKey.get(), EVP_sha256()))
    return openSslError(fmt::format("signing the certificate of {}", request.subject.commonName));
  PemPair pair;
  ASSIGN_OR_RETURN(pair.certificate, pemOf(cert.get()));
  ASSIGN_OR_RETURN(pair.privateKey, pemOf(key.get()));
  return pair;
}

StatusOr<CertificateSubject> certificateSubject(const std::string& pem) {
  ASSIGN_OR_RETURN(Cert cert, readCertificate(pem));
  X509_NAME* name = X509_get_subject_name(cert.get());
  return CertificateSubject{.commonName = nameField(name, NID_commonName),
                            .organization = nameField(name, NID_organizationName),
                            .organizationalUnit = nameField(name, NID_organizationalUnitName)};
}

}  // namespace loom::security
