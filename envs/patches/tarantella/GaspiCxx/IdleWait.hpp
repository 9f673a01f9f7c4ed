/*
 * ddl-compare's patch to GaspiCxx (envs/patches/tarantella, docs/improvements.md).
 *
 * GaspiCxx's progress thread (RoundRobinDedicatedThread) sweeps its
 * registered collectives without pause for as long as any is registered,
 * and Tarantella registers its all-reducers for the whole training: each
 * rank keeps one core busy even while no collective runs (forward,
 * backward, data loading). Where ranks share cores, that spinning takes
 * the cores the training needs.
 *
 * These functions let the progress thread sleep while no collective of
 * this process is running (CollectiveLowLevel counts its collectives in
 * and out of the RUNNING state, and a start wakes the thread at once), and
 * pause briefly between sweeps while one runs.
 */
#pragma once

#include <atomic>

namespace gaspi
{
  namespace progress_engine
  {
    namespace idle
    {
      // A collective entered the RUNNING state: wake the progress thread.
      void collective_started();
      // A collective left the RUNNING state (it completed).
      void collective_finished();
      // Called before each sweep. While a collective runs: a pause of
      // DDLC_GASPI_SWEEP_PAUSE_US microseconds (50 unless set); else sleeps
      // until one starts (or, as a safety net, a few milliseconds pass).
      // Returns at once once `stop` is set. With the pause set to 0, returns
      // at once always: upstream's spinning, in the same build.
      void wait_while_idle(std::atomic<bool> const& stop);
    }
  }
}
