// Running a piece of a test in a forked child, with a bound on how long it may take: a
// hang in the child fails the test instead of hanging the run.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <thread>

namespace zf_test {

// Runs `body` in a forked child and returns its exit status: the child's exit code, 128 +
// the signal that killed it, or -1 when it was still running after `timeout_seconds` (it is
// then killed). The child never returns into the test framework: it ends with _exit()
// unless `body` itself exits.
inline int run_in_child(const std::function<int()>& body, double timeout_seconds = 10.0) {
  std::fflush(stdout);  // or the child's exit() would flush the parent's buffered output twice
  std::fflush(stderr);
  const pid_t child = fork();
  if (child < 0) return -2;
  if (child == 0) {
    int code = 97;
    try {
      code = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: exception: %s\n", e.what());
      code = 98;
    } catch (...) {
      code = 99;
    }
    _exit(code);
  }
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    int status = 0;
    const pid_t done = waitpid(child, &status, WNOHANG);
    if (done == child) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -3;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_seconds) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace zf_test
