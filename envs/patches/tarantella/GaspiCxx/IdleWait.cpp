/*
 * ddl-compare's patch to GaspiCxx: see IdleWait.hpp.
 */
#include <GaspiCxx/progress_engine/IdleWait.hpp>

#include <chrono>
#include <condition_variable>
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
        // The pause between two sweeps while a collective runs. Without it
        // the thread still spins for as long as any collective is RUNNING,
        // which at two ranks is most of the step (a ring all-reduce stays
        // RUNNING until the peer has joined). A ring step then waits at most
        // this long (the kernel's timer slack adds about 50 us) for the
        // sweep that posts its next message: well under 1 % of the
        // exchange at the sizes measured, against a core freed. A thread
        // that waits for its own collective (waitForCompletion) still
        // progresses it without pause.
        constexpr auto SWEEP_PAUSE = std::chrono::microseconds(50);
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
        std::unique_lock<std::mutex> lock(mutex);
        if (running > 0)
        {
          lock.unlock();
          std::this_thread::sleep_for(SWEEP_PAUSE);
          return;
        }
        wake.wait_for(lock, SAFETY_NET, [&stop] { return running > 0 || stop.load(); });
      }
    }
  }
}
