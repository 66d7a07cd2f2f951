// `traincoord history`: a run's loss history as CSV or JSON lines, for notebooks and plotting
// tools (GET /v1/runs/RUN/history?format=...).
#include <iostream>

#include "cli/commands.h"
#include "traincoord/client.h"

namespace traincoord::cli {

int history(const HistoryArgs& args) {
  auto body = client::get(args.url, "/v1/runs/" + args.run + "/history?format=" + args.format);
  if (!body) return report_client_error(body.error(), args.url);
  std::cout << *body;
  if (args.format == "json") std::cout << "\n";
  return std::cout.flush() ? exit_code::kOk : exit_code::kFailed;
}

}  // namespace traincoord::cli
