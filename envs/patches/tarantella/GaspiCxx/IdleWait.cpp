/*
 * ddl-compare's patch to GaspiCxx: see IdleWait.hpp.
 */
#include <GaspiCxx/progress_engine/IdleWait.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>

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
        wake.wait_for(lock, SAFETY_NET, [&stop] { return running > 0 || stop.load(); });
      }
    }
  }
}
