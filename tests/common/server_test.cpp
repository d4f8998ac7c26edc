#include "common/server.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "common/net.h"
#include "health.grpc.pb.h"

namespace conveyor {
namespace {

// A server writing to a peer that is gone (a killed replica's socket) gets
// EPIPE, not SIGPIPE's death. In a child, since it changes the process's
// signal dispositions.
TEST(ServerProcess, AWriteToAClosedPeerFailsInsteadOfKillingTheProcess) {
  EXPECT_EXIT(
      {
        InstallCrashHandler("server_test");
        int fds[2];
        if (pipe(fds) != 0) std::_Exit(2);
        close(fds[0]);
        const char byte = 1;
        const bool epipe = write(fds[1], &byte, 1) == -1 && errno == EPIPE;
        std::_Exit(epipe ? 0 : 3);
      },
      ::testing::ExitedWithCode(0), "");
}

// The standard health check, as `conveyor health` and the deployments' probes
// ask it: SERVING for the server as a whole, NOT_FOUND naming a service it was
// not asked about, and no Watch stream (UNIMPLEMENTED) from the synchronous
// service that replaced gRPC's callback-based default (common/server.cpp).
TEST(ServerHealth, CheckSaysServingForTheServerAndNotFoundForANameWatchIsNotServed) {
  auto server = GrpcServer::Start("127.0.0.1:0", {});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = grpc::health::v1::Health::NewStub(MakeChannel((*server)->address()));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse reply;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(10));
    grpc::Status st = stub->Check(&ctx, req, &reply);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(reply.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  {
    req.set_service("conveyor.v1.NoSuchService");
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(10));
    grpc::Status st = stub->Check(&ctx, req, &reply);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_NE(st.error_message().find("conveyor.v1.NoSuchService"), std::string::npos) << st.error_message();
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineAfter(10));
    auto watch = stub->Watch(&ctx, grpc::health::v1::HealthCheckRequest());
    EXPECT_FALSE(watch->Read(&reply));
    EXPECT_EQ(watch->Finish().error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
}

}  // namespace
}  // namespace conveyor
