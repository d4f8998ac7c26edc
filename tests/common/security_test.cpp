// Loading TLS files and checking bearer tokens (common/security.h).
#include "common/security.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/support/test_util.h"
#include "common/files.h"

namespace conveyor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

class LoadTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::MakeTempDir("security"));
    node_ = new TlsFiles(testing::MakeCertificate(*dir_, "node", {"localhost", "127.0.0.1"}));
    other_ = new TlsFiles(testing::MakeCertificate(*dir_, "other"));
  }
  static void TearDownTestSuite() {
    RemoveTree(*dir_);
    delete node_;
    delete other_;
    delete dir_;
  }
  static std::string Write(const std::string& name, const std::string& text) {
    const std::string path = *dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  static std::string* dir_;
  static TlsFiles* node_;
  static TlsFiles* other_;
};

std::string* LoadTlsTest::dir_ = nullptr;
TlsFiles* LoadTlsTest::node_ = nullptr;
TlsFiles* LoadTlsTest::other_ = nullptr;

TEST_F(LoadTlsTest, NoFilesMeansInsecure) {
  auto tls = LoadTls(TlsFiles());
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_FALSE(tls->has_value());
}

TEST_F(LoadTlsTest, ACompleteSetLoads) {
  TlsFiles files = *node_;
  files.server_name = "node.example";
  auto tls = LoadTls(files);
  ASSERT_TRUE(tls.ok()) << tls.status();
  ASSERT_TRUE(tls->has_value());
  EXPECT_THAT((*tls)->cert_pem, HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_THAT((*tls)->key_pem, HasSubstr("PRIVATE KEY"));
  EXPECT_THAT((*tls)->ca_pem, HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_EQ((*tls)->server_name, "node.example");
}

TEST_F(LoadTlsTest, APartialSetNamesWhatIsMissing) {
  TlsFiles files;
  files.cert = node_->cert;
  auto tls = LoadTls(files);
  EXPECT_EQ(tls.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tls.status().message(), HasSubstr("missing --tls-key and --tls-ca"));
  files.key = node_->key;
  EXPECT_THAT(LoadTls(files).status().message(), AllOf(HasSubstr("missing --tls-ca"), Not(HasSubstr("missing --tls-key"))));
  files = TlsFiles();
  files.ca = node_->ca;
  EXPECT_THAT(LoadTls(files).status().message(), HasSubstr("missing --tls-cert and --tls-key"));
  files = TlsFiles();
  files.server_name = "node.example";
  EXPECT_EQ(LoadTls(files).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(LoadTlsTest, AnUnreadableFileIsNotFoundAndNamed) {
  TlsFiles files = *node_;
  files.key = *dir_ + "/no-such.key";
  auto tls = LoadTls(files);
  EXPECT_EQ(tls.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(tls.status().message(), HasSubstr("--tls-key " + files.key));
}

TEST_F(LoadTlsTest, AFileWithoutPemIsInvalidArgumentAndNamed) {
  const std::string junk = Write("junk.pem", "not a certificate\n");
  for (std::string TlsFiles::*field : {&TlsFiles::cert, &TlsFiles::key, &TlsFiles::ca}) {
    TlsFiles files = *node_;
    files.*field = junk;
    auto tls = LoadTls(files);
    EXPECT_EQ(tls.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(tls.status().message(), HasSubstr(junk));
  }
}

TEST_F(LoadTlsTest, AKeyOfAnotherCertificateIsRefused) {
  TlsFiles files = *node_;
  files.key = other_->key;
  auto tls = LoadTls(files);
  EXPECT_EQ(tls.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tls.status().message(), HasSubstr("is not the key of the certificate in " + node_->cert));
}

TEST_F(LoadTlsTest, TokenFiles) {
  auto token = ReadTokenFile(Write("token", "  s3cret-token\n"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cret-token");
  const std::string empty = Write("empty-token", "\n \n");
  EXPECT_EQ(ReadTokenFile(empty).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ReadTokenFile(empty).status().message(), HasSubstr(empty));
  auto spaced = ReadTokenFile(Write("spaced-token", "two words\n"));
  EXPECT_EQ(spaced.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spaced.status().message(), Not(HasSubstr("words")));
  EXPECT_EQ(ReadTokenFile(*dir_ + "/no-such-token").status().code(), absl::StatusCode::kNotFound);
}

// What a server sees of the client's metadata.
Status Check(const std::vector<std::pair<std::string, std::string>>& sent, const std::string& expected) {
  std::multimap<grpc::string_ref, grpc::string_ref> metadata;
  for (const auto& [k, v] : sent) metadata.emplace(k, v);
  return CheckBearerToken(metadata, expected);
}

TEST(BearerToken, OnlyTheRightTokenPasses) {
  EXPECT_TRUE(Check({{"authorization", "Bearer s3cret"}}, "s3cret").ok());
  EXPECT_TRUE(Check({}, "").ok()) << "no token configured: everyone passes";

  Status none = Check({{"x-other", "s3cret"}}, "s3cret");
  EXPECT_EQ(none.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(none.message(), HasSubstr("requires a token"));
  for (const std::string& wrong : {"Bearer s3cre", "Bearer s3cret2", "Bearer S3CRET", "s3cret", "Basic s3cret"}) {
    Status st = Check({{"authorization", wrong}}, "s3cret");
    EXPECT_EQ(st.code(), absl::StatusCode::kUnauthenticated) << wrong;
    EXPECT_THAT(st.message(), AllOf(HasSubstr("not accepted"), Not(HasSubstr("s3cre")))) << wrong;
  }
}

}  // namespace
}  // namespace conveyor
