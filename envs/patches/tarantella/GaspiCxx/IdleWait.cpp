/*
 * ddl-compare's patch to GaspiCxx: see IdleWait.hpp.
 */
#include <GaspiCxx/progress_engine/IdleWait.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace gaspi
{
  namespace progress_engine
  {
    namespace idle
    {
      namespace
      {
        std::mutex mutex;
        std::condition_variable wake;
        long running = 0;  // collectives of this process in the RUNNING state
        // The longest sleep without a start: the destructor's stop flag is
        // seen within it (it notifies its own condition, not this one).
        constexpr auto SAFETY_NET = std::chrono::milliseconds(5);
        // The pause between two sweeps while a collective runs, by default.
        // Without it the thread still spins for as long as any collective
        // is RUNNING, which at two ranks is most of the step (a ring
        // all-reduce stays RUNNING until the peer has joined). A ring step
        // then waits at most this long (the kernel's timer slack adds about
        // 50 us) for the sweep that posts its next message: well under 1 %
        // of the exchange at the sizes measured, against a core freed. A
        // thread that waits for its own collective (waitForCompletion)
        // still progresses it without pause.
        constexpr long DEFAULT_PAUSE_US = 50;
        // Where the pause is set: microseconds, 0 for upstream's behaviour
        // (the thread never sleeps, idle or not).
        constexpr char const* PAUSE_VARIABLE = "DDLC_GASPI_SWEEP_PAUSE_US";

        // The pause, read once from the environment; a value that is not a
        // whole number of microseconds from 0 to 1 s is said on stderr and
        // the default kept.
        long pause_us()
        {
          static long const pause = [] {
            char const* text = std::getenv(PAUSE_VARIABLE);
            if (text == nullptr || *text == '\0')
            {
              return DEFAULT_PAUSE_US;
            }
            char* end = nullptr;
            long const value = std::strtol(text, &end, 10);
            if (*end != '\0' || value < 0 || value > 1000000)
            {
              std::fprintf(stderr,
                           "GaspiCxx (ddl-compare's patch): %s=%s is not a number of "
                           "microseconds from 0 to 1000000; using %ld\n",
                           PAUSE_VARIABLE, text, DEFAULT_PAUSE_US);
              return DEFAULT_PAUSE_US;
            }
            return value;
          }();
          return pause;
        }
      }

      void collective_started()
      {
        {
          std::lock_guard<std::mutex> lock(mutex);
          ++running;
        }
        wake.notify_all();
      }

      void collective_finished()
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (running > 0)
        {
          --running;
        }
      }

      void wait_while_idle(std::atomic<bool> const& stop)
      {
        long const pause = pause_us();
        if (pause == 0)
        {
          return;  // upstream's progress thread: sweep again at once
        }
        std::unique_lock<std::mutex> lock(mutex);
        if (running > 0)
        {
          lock.unlock();
          std::this_thread::sleep_for(std::chrono::microseconds(pause));
          return;
        }
        wake.wait_for(lock, SAFETY_NET, [&stop] { return running > 0 || stop.load(); });
      }
    }
  }
}
