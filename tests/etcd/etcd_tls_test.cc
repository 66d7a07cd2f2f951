// TLS to etcd (docs/HA.md): a real etcd member serving HTTPS only, with --client-cert-auth and
// its authentication on, certificates made for the test (tests/etcd/make-etcd-certs). The etcd
// client verifies the member against --etcd-cacert and shows --etcd-cert; a coordinator on
// `--journal etcds://...` leads and a worker completes the run through it; a wrong CA is
// refused, saying so; neither the password nor a key is ever printed.
#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "e2e/server_process.h"
#include "etcd/etcd_cluster.h"
#include "etcd/ha_http.h"
#include "journal/etcd_client.h"
#include "journal/etcd_options.h"

namespace traincoord {
namespace {

using testing::EtcdCluster;
using testing::EtcdTls;
using testing::ServerProcess;
using testing::TempDir;

constexpr const char* kPassword = "tls-s3cret";

class EtcdOverTls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new TempDir();
    const std::string made = testing::run_command("bash " + std::string(TRAINCOORD_SOURCE_DIR) +
                                                  "/tests/etcd/make-etcd-certs " + certs_->path() +
                                                  " 2>&1 && echo made");
    ASSERT_NE(made.find("made"), std::string::npos) << made;
    cluster_ = new EtcdCluster(1, "etcd", EtcdTls{pem("etcd"), pem("etcd-key"), pem("ca")});
    ASSERT_TRUE(cluster_->started());
    // etcd's authentication on, through etcdctl over the same TLS.
    const std::string etcdctl = "etcdctl --endpoints https://" + cluster_->endpoint(0) +
                                " --cacert " + pem("ca") + " --cert " + pem("client") + " --key " +
                                pem("client-key") + " ";
    for (const std::string& command :
         {"user add root:" + std::string(kPassword), std::string("role add root"),
          std::string("user grant-role root root"), std::string("auth enable")}) {
      int status = -1;
      const std::string said = testing::run_command(etcdctl + command + " 2>&1", &status);
      ASSERT_EQ(status, 0) << "etcdctl " << command << ": " << said;
    }
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    delete certs_;
    certs_ = nullptr;
  }
  void SetUp() override {
    if (!cluster_ || !cluster_->started()) GTEST_SKIP() << "the TLS etcd member did not start";
  }

  static std::string pem(const std::string& name) { return certs_->path() + "/" + name + ".pem"; }
  static etcd::ClientOptions options(etcd::TlsFiles tls) {
    etcd::ClientOptions o{
        {cluster_->endpoint(0)}, std::chrono::milliseconds(1000), std::chrono::milliseconds(1500)};
    o.tls = std::move(tls);
    return o;
  }
  // The base64 body of a PEM key file (what must never be printed).
  static std::vector<std::string> key_lines(const std::string& file) {
    std::ifstream in(file);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("-----", 0) != 0 && line.size() >= 16) lines.push_back(line);
    }
    return lines;
  }
  // Says what of the password or the keys `output` shows, or "" when none.
  static std::string secrets_in(const std::string& output) {
    if (output.find(kPassword) != std::string::npos) return "the password";
    for (const char* key : {"client-key", "other-client-key", "etcd-key", "ca-key"}) {
      for (const std::string& line : key_lines(pem(key))) {
        if (output.find(line) != std::string::npos) return "a line of " + std::string(key) + ".pem";
      }
    }
    if (output.find("PRIVATE KEY") != std::string::npos) return "a private key";
    return "";
  }
  // Starts `traincoord serve ARGS`, its stderr with its stdout.
  static std::unique_ptr<ServerProcess> serve(const std::vector<std::string>& args) {
    return ServerProcess::start(args, 0, TRAINCOORD_BIN,
                                {"/bin/sh", "-c", "exec \"$@\" 2>&1", "sh"});
  }
  std::string config() {
    return dir_.write("tls.toml", R"(name = "tls"
[data]
train_batches = 12
dev_batches = 2
[schedule]
epochs = 2
)");
  }
  std::string journal(const std::string& prefix) const {
    return "etcds://root:" + std::string(kPassword) + "@" + cluster_->endpoint(0) + prefix;
  }

  static TempDir* certs_;
  static EtcdCluster* cluster_;
  TempDir dir_;
};

TempDir* EtcdOverTls::certs_ = nullptr;
EtcdCluster* EtcdOverTls::cluster_ = nullptr;

TEST_F(EtcdOverTls, TheClientVerifiesTheMemberAndShowsItsCertificate) {
  etcd::Client client(options({true, pem("ca"), pem("client"), pem("client-key")}));
  client.authenticate_as("root", kPassword);
  auto put = client.put("/tls/k", "over https");
  ASSERT_TRUE(put) << put.error().message;
  auto got = client.range("/tls/k");
  ASSERT_TRUE(got) << got.error().message;
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].value, "over https");
  auto lease = client.lease_grant(5);
  ASSERT_TRUE(lease) << lease.error().message;
  EXPECT_TRUE(client.lease_revoke(lease->id));

  // Mutual TLS: without a certificate, or with one another CA signed, etcd refuses the client.
  for (const etcd::TlsFiles& tls :
       {etcd::TlsFiles{true, pem("ca"), "", ""},
        etcd::TlsFiles{true, pem("ca"), pem("other-client"), pem("other-client-key")}}) {
    etcd::Client refused(options(tls));
    refused.authenticate_as("root", kPassword);
    auto r = refused.put("/tls/k", "v");
    ASSERT_FALSE(r) << tls.cert_file;
    // (with TLS 1.3 the client hears of it at its first read: an alert, or a reset)
    EXPECT_NE(r.error().message.find("etcd at " + cluster_->endpoint(0)), std::string::npos)
        << r.error().message;
    EXPECT_EQ(secrets_in(r.error().message), "") << r.error().message;
  }
  // Plain HTTP to an HTTPS member gets no answer it can use.
  etcd::Client plain(options({}));
  EXPECT_FALSE(plain.put("/tls/k", "v"));
}

TEST_F(EtcdOverTls, AMemberTheCaDidNotSignIsRefusedSayingSo) {
  etcd::Client client(options({true, pem("other-ca"), pem("client"), pem("client-key")}));
  client.authenticate_as("root", kPassword);
  auto r = client.put("/tls/k", "v");
  ASSERT_FALSE(r);
  const std::string& m = r.error().message;
  EXPECT_NE(m.find("TLS handshake failed: its certificate is not trusted"), std::string::npos) << m;
  EXPECT_NE(m.find("--etcd-cacert " + pem("other-ca")), std::string::npos) << m;
  EXPECT_NE(m.find(cluster_->endpoint(0)), std::string::npos) << m;
  EXPECT_EQ(secrets_in(m), "") << m;
  // Nothing was written: the right CA reads no such key.
  etcd::Client right(options({true, pem("ca"), pem("client"), pem("client-key")}));
  right.authenticate_as("root", kPassword);
  auto got = right.range("/tls/k-wrong-ca");
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_TRUE(got->kvs.empty());
}

TEST_F(EtcdOverTls, FilesThatCannotBeUsedAreNamedByTheirFlagNeverShown) {
  auto missing = etcd::check_tls_files({true, dir_.path() + "/nowhere.pem", "", ""});
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().field, "etcd-cacert");
  EXPECT_NE(missing.error().message.find("--etcd-cacert " + dir_.path() + "/nowhere.pem"),
            std::string::npos)
      << missing.error().message;
  // A key that is not the certificate's.
  auto mismatched =
      etcd::check_tls_files({true, pem("ca"), pem("client"), pem("other-client-key")});
  ASSERT_FALSE(mismatched);
  EXPECT_EQ(mismatched.error().field, "etcd-key");
  EXPECT_EQ(secrets_in(mismatched.error().message), "") << mismatched.error().message;
  EXPECT_TRUE(etcd::check_tls_files({true, pem("ca"), pem("client"), pem("client-key")}));

  // The coordinator says the same and stops, before it listens.
  int status = -1;
  const std::string said = testing::run_command(
      std::string(TRAINCOORD_BIN) + " serve --config " + config() + " --journal " +
          journal("/bad-key") + " --etcd-cacert " + pem("ca") + " --etcd-cert " + pem("client") +
          " --etcd-key " + pem("other-client-key") + " --listen 127.0.0.1:0 2>&1",
      &status);
  EXPECT_NE(status, 0) << said;
  EXPECT_NE(said.find("--etcd-key " + pem("other-client-key")), std::string::npos) << said;
  EXPECT_EQ(secrets_in(said), "") << said;
  // TLS files with a plain etcd:// journal: refused, naming the flag.
  const std::string plain =
      testing::run_command(std::string(TRAINCOORD_BIN) + " serve --config " + config() +
                               " --journal etcd://" + cluster_->endpoint(0) +
                               "/plain --etcd-cacert " + pem("ca") + " --listen 127.0.0.1:0 2>&1",
                           &status);
  EXPECT_NE(status, 0) << plain;
  EXPECT_NE(plain.find("--etcd-cacert needs TLS to etcd: --journal etcds://"), std::string::npos)
      << plain;
}

TEST_F(EtcdOverTls, ACoordinatorOnEtcdsLeadsAndAWorkerCompletesTheRun) {
  auto server = serve({"--config", config(), "--journal", journal("/run"), "--etcd-cacert",
                       pem("ca"), "--etcd-cert", pem("client"), "--etcd-key", pem("client-key")});
  ASSERT_TRUE(server);
  bool served = false;
  for (int i = 0; i < 100 && !served; ++i) {
    served = testing::http(server->url(), "GET", "/v1/runs/tls").status == 200;
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(served) << server->read_output();
  testing::WorkerProcess worker({EXAMPLE_WORKER_BIN, "--url", server->url(), "--run", "tls",
                                 "--name", "w0", "--job-ms", "1", "--give-up-after", "30"},
                                dir_.path() + "/w0.out");
  EXPECT_EQ(worker.wait(60), 0) << testing::read_file(dir_.path() + "/w0.out");
  const testing::Reply status = testing::http(server->url(), "GET", "/v1/runs/tls?epochs=10");
  ASSERT_EQ(status.status, 200) << status.body;
  rapidjson::Document d;
  d.Parse(status.body.c_str());
  EXPECT_STREQ(d["state"].GetString(), "completed") << status.body;
  EXPECT_EQ(d["counters"]["completions_accepted"].GetInt64(), 2 * (12 + 2)) << status.body;
  const std::string said = server->read_output();
  EXPECT_NE(said.find("state in etcds://root@" + cluster_->endpoint(0) + "/run"), std::string::npos)
      << said;
  EXPECT_NE(said.find("leading run tls of etcds://root@"), std::string::npos) << said;
  EXPECT_EQ(secrets_in(said), "") << said;

  // What it wrote is in etcd (read back over TLS): the run's journal head (leadership per run).
  etcd::Client client(options({true, pem("ca"), pem("client"), pem("client-key")}));
  client.authenticate_as("root", kPassword);
  auto head = client.range("/run/head/tls");
  ASSERT_TRUE(head) << head.error().message;
  ASSERT_EQ(head->kvs.size(), 1u);
  std::istringstream words(head->kvs[0].value);  // "TERM SEQ TIME"
  int64_t term = 0, seq = 0;
  words >> term >> seq;
  EXPECT_GT(term, 0) << head->kvs[0].value;
  EXPECT_GE(seq, 2 * (12 + 2)) << head->kvs[0].value;
}

TEST_F(EtcdOverTls, ACoordinatorGivenAnotherCaStandsByAndSaysWhy) {
  auto server =
      serve({"--config", config(), "--journal", journal("/wrong-ca"), "--etcd-cacert",
             pem("other-ca"), "--etcd-cert", pem("client"), "--etcd-key", pem("client-key")});
  ASSERT_TRUE(server);
  std::string said;
  for (int i = 0; i < 100 && said.find("not trusted") == std::string::npos; ++i) {
    said = server->read_output(100);
  }
  EXPECT_NE(said.find("TLS handshake failed: its certificate is not trusted"), std::string::npos)
      << said;
  EXPECT_NE(said.find("(checked against --etcd-cacert " + pem("other-ca") + ")"), std::string::npos)
      << said;
  // It leads nothing: every run request is 421, no leader known.
  const testing::Reply r = testing::http(server->url(), "GET", "/v1/runs/tls");
  EXPECT_EQ(r.status, 421) << r.body;
  EXPECT_EQ(secrets_in(server->read_output()), "") << server->read_output();
}

}  // namespace
}  // namespace traincoord
