// `traincoord apply-config FILE`: a started run's changed config applied by the coordinator that
// serves it, while it serves (POST /v1/runs/{run}/config; docs/CLI.md). The same rules as
// `serve --apply-config-changes` at a start, without the restart.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include "cli/commands.h"
#include "cli/terminal_text.h"
#include "config/config_file.h"
#include "traincoord/client.h"

namespace traincoord::cli {

int apply_config(const ApplyConfigArgs& args) {
  auto config = load_run_config(args.config);
  if (!config) {
    std::cerr << "traincoord: " << terminal_safe(config.error().message) << "\n";
    return exit_code::kUsage;
  }
  std::ifstream in(args.config, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  // (lengths read from files go inline: the coordinator reads no file of ours)
  const std::string toml = durable_config_text(text.str(), *config);
  rapidjson::StringBuffer body;
  rapidjson::Writer<rapidjson::StringBuffer> w(body);
  w.StartObject();
  w.Key("toml");
  w.String(toml.data(), static_cast<rapidjson::SizeType>(toml.size()));
  w.Key("dry_run");
  w.Bool(args.dry_run);
  w.EndObject();
  const std::string& run = config->name;
  auto reply = client::post(args.url, "/v1/runs/" + run + "/config", body.GetString(),
                            std::chrono::milliseconds(30'000));
  if (!reply) {
    const client::ClientError& e = reply.error();
    if (e.code == "config_change_refused" || e.code == "invalid_argument") {
      std::cerr << "traincoord: " << terminal_safe(e.message) << "\n";
      return exit_code::kUsage;
    }
    return report_client_error(e, args.url);
  }
  rapidjson::Document d;
  d.Parse(reply->c_str());
  std::string fields;
  if (d.IsObject() && d.HasMember("changed") && d["changed"].IsArray()) {
    for (const auto& f : d["changed"].GetArray()) {
      if (f.IsString()) fields += (fields.empty() ? "" : ", ") + std::string(f.GetString());
    }
  }
  if (fields.empty()) {
    std::cout << "run " << terminal_safe(run)
              << ": its config is already this one; nothing to change\n";
  } else if (args.dry_run) {
    std::cout << "run " << terminal_safe(run) << ": would change " << terminal_safe(fields)
              << " (--dry-run: nothing changed)\n";
  } else {
    std::cout << "traincoord: applied the changed " << terminal_safe(fields) << " to run "
              << terminal_safe(run) << " (" << terminal_safe(args.config) << ")\n";
  }
  return exit_code::kOk;
}

}  // namespace traincoord::cli
