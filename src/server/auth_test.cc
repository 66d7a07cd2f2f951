#include "server/auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "temp_dir.h"

namespace traincoord {
namespace {

using testing::TempDir;

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

TEST(Auth, RunTokensAndTheAdminTokenLiveInSeparateNamespacesWhateverTheRunIsCalled) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/tokens";
  auto auth = Auth::open(dir);
  ASSERT_TRUE(auth) << auth.error().message;
  auto admin_run = auth->worker_token("admin");
  ASSERT_TRUE(admin_run) << admin_run.error().message;
  EXPECT_NE(*admin_run, auth->admin_token());
  EXPECT_NE(auth->worker_token_path("admin"), auth->admin_token_path());
  EXPECT_EQ(auth->worker_token_path("admin"), dir + "/runs/admin.token");
  EXPECT_EQ(first_line(dir + "/admin.token"), auth->admin_token());
  EXPECT_EQ(first_line(dir + "/runs/admin.token"), *admin_run);
  // So a worker of run "admin" cannot do what only the administrator may.
  auto status = [&](const char* method, const char* target, const std::string& token) {
    auto r = auth->check(method, target, "Bearer " + token);
    return r ? r->status : 200;
  };
  EXPECT_EQ(status("POST", "/v1/runs/admin/acquire", *admin_run), 200);
  EXPECT_EQ(status("POST", "/v1/runs", *admin_run), 403);
  EXPECT_EQ(status("POST", "/v1/runs/admin/cancel", *admin_run), 403);
  EXPECT_EQ(status("GET", "/metrics", *admin_run), 403);
  // Both folders are private.
  struct stat st {};
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((dir + "/runs").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST(Auth, NamesThatCouldLeaveTheRunsFolderGetNoToken) {
  TempDir tmp;
  auto auth = Auth::open(tmp.path() + "/tokens");
  ASSERT_TRUE(auth) << auth.error().message;
  for (const char* bad : {"", ".", "..", "../admin", "a/b", ".hidden", "caf\xc3\xa9"}) {
    auto t = auth->worker_token(bad);
    EXPECT_FALSE(t) << bad;
    if (!t) {
      EXPECT_EQ(t.error().field, "run");
    }
  }
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/tokens/..token"));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/tokens/runs/..token"));
}

TEST(Auth, TheBearerSchemeIsMatchedInAnyCase) {
  EXPECT_EQ(bearer_token("Bearer abc"), "abc");
  EXPECT_EQ(bearer_token("bearer abc"), "abc");
  EXPECT_EQ(bearer_token("BEARER abc"), "abc");
  EXPECT_EQ(bearer_token("bEaReR   abc  "), "abc");
  EXPECT_EQ(bearer_token("Bearer"), "");
  EXPECT_EQ(bearer_token("Bearer "), "");
  EXPECT_EQ(bearer_token("Bearerabc"), "");
  EXPECT_EQ(bearer_token("Basic abc"), "");
  TempDir tmp;
  auto auth = Auth::open(tmp.path() + "/tokens");
  ASSERT_TRUE(auth) << auth.error().message;
  EXPECT_FALSE(auth->check("GET", "/metrics", "bearer " + auth->admin_token()));
  EXPECT_FALSE(auth->check("GET", "/metrics", "BEARER " + auth->admin_token()));
}

TEST(Auth, ATokenFileOfTheOldLayoutIsMovedKeepingItsToken) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/tokens";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  for (const char* name : {"admin", "r"}) {
    const std::string path = dir + "/" + name + ".token";
    std::ofstream(path) << name << "-token" << std::string(58, 't') << "\n";
    ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  }
  auto auth = Auth::open(dir);
  ASSERT_TRUE(auth) << auth.error().message;
  const std::string pad(58, 't');
  EXPECT_EQ(auth->admin_token(), "admin-token" + pad);
  EXPECT_EQ(*auth->worker_token("r"), "r-token" + pad);
  EXPECT_FALSE(std::filesystem::exists(dir + "/r.token"));
  EXPECT_EQ(first_line(dir + "/runs/r.token"), "r-token" + pad);
  // A run named admin had the admin token as its worker token: it gets one of its own, the
  // admin token stays, and the operator is told.
  auto admin_run = auth->worker_token("admin");
  ASSERT_TRUE(admin_run);
  EXPECT_NE(*admin_run, "admin-token" + pad);
  EXPECT_EQ(first_line(dir + "/admin.token"), "admin-token" + pad);
  const auto notices = auth->take_notices();
  ASSERT_EQ(notices.size(), 2u);
  EXPECT_NE(notices[0].find("moved run r's worker token file"), std::string::npos);
  EXPECT_NE(notices[1].find("run admin gets a worker token of its own"), std::string::npos);
}

TEST(Auth, TokensOthersCouldHaveWrittenOrMayReadAreRefused) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/tokens";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  std::ofstream(dir + "/admin.token") << std::string(64, 'g') << "\n";
  ASSERT_EQ(chmod((dir + "/admin.token").c_str(), 0644), 0);
  auto auth = Auth::open(dir);
  ASSERT_FALSE(auth);
  EXPECT_NE(auth.error().message.find("chmod 600"), std::string::npos) << auth.error().message;

  ASSERT_EQ(chmod((dir + "/admin.token").c_str(), 0600), 0);
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  auth = Auth::open(dir);
  ASSERT_FALSE(auth);
  EXPECT_NE(auth.error().message.find("chmod 700"), std::string::npos) << auth.error().message;

  ASSERT_EQ(chmod(dir.c_str(), 0700), 0);
  std::filesystem::create_symlink("/etc/hostname", dir + "/runs/r.token");
  auth = Auth::open(dir);
  ASSERT_TRUE(auth) << auth.error().message;
  EXPECT_FALSE(auth->worker_token("r"));
}

}  // namespace
}  // namespace traincoord
