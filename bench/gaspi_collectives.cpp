// GaspiCxx's own collectives, timed and repeated, for the benches
// bench/gaspi_allreduce_latency.py and bench/gaspi_setup_hangs.py (which
// compile this file against a Tarantella build's GaspiCxx and start it on
// 2 ranks with gaspi_run).
//
//   gaspi_collectives latency BYTES[,BYTES...] REPS WARMUP
//     Per size, one ring all-reduce of floats (GaspiCxx's
//     AllreduceLowLevel, registered with the runtime's progress engine as
//     its Allreduce class does), REPS times after WARMUP, all ranks
//     starting together (a barrier before each). Two ways to finish it:
//       progress: the main thread only watches for completion (sched_yield
//                 between looks), so the progress thread alone drives the
//                 ring: the path of an all-reduce Tarantella starts during
//                 backward;
//       wait:     the main thread calls waitForCompletion at once, so it
//                 drives the ring too (Tarantella's finish_allreduce).
//     Rank 0 prints "latency MODE BYTES MEDIAN_US P95_US" per size and mode.
//   gaspi_collectives setups COUNT
//     COUNT times: set up a fresh all-reduce (the set-up handshake through
//     GaspiCxx's passive messages, where the documented hangs stopped),
//     run it once, check the sum, tear it down; one all-reduce stays
//     registered throughout, as Tarantella's gradient all-reducers do, so
//     the progress thread has a collective to sweep. Rank 0 prints
//     "setup I" after each, the caller's watchdog reads them.

#include <GaspiCxx/Runtime.hpp>
#include <GaspiCxx/collectives/non_blocking/Allreduce.hpp>
#include <GaspiCxx/group/Group.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sched.h>
#include <sstream>
#include <string>
#include <vector>

namespace
{
  using gaspi::collectives::AllreduceAlgorithm;
  using gaspi::collectives::AllreduceLowLevel;
  using gaspi::collectives::ReductionOp;
  using Clock = std::chrono::steady_clock;
  using RingAllreduce = AllreduceLowLevel<float, AllreduceAlgorithm::RING>;

  bool is_rank_zero()
  {
    return gaspi::getRuntime().global_rank() == 0;
  }

  // One registered ring all-reduce of `count` floats, deregistered on exit.
  class Registered
  {
    public:
      explicit Registered(std::size_t count)
      : engine(gaspi::getRuntime().getDefaultProgressEngine()),
        impl(std::make_shared<RingAllreduce>(gaspi::group::Group(), count, ReductionOp::SUM))
      {
        impl->waitForSetup();
        handle = engine.register_collective(impl);
      }
      ~Registered()
      {
        engine.deregister_collective(handle);
      }
      RingAllreduce& operator*()
      {
        return *impl;
      }

    private:
      gaspi::progress_engine::ProgressEngine& engine;
      std::shared_ptr<RingAllreduce> impl;
      gaspi::progress_engine::ProgressEngine::CollectiveHandle handle{};
  };

  // Seconds of one all-reduce, from start to completion on this rank.
  double run_once(RingAllreduce& allreduce, std::vector<float>& data, bool by_progress_thread)
  {
    gaspi::getRuntime().barrier();
    allreduce.copyIn(data.data());
    auto const start = Clock::now();
    allreduce.start();
    if (by_progress_thread)
    {
      while (!allreduce.checkForCompletion())
      {
        sched_yield();
      }
    }
    else
    {
      allreduce.waitForCompletion();
    }
    auto const seconds = std::chrono::duration<double>(Clock::now() - start).count();
    allreduce.copyOut(data.data());
    return seconds;
  }

  double quantile(std::vector<double> values, double q)
  {
    std::sort(values.begin(), values.end());
    auto const index = static_cast<std::size_t>(q * static_cast<double>(values.size() - 1) + 0.5);
    return values[index];
  }

  int latency(std::string const& sizes, int reps, int warmup)
  {
    {
      // The first collectives of a process pay for its connections and
      // registrations: paid here, not by the first size.
      Registered first(1024);
      std::vector<float> data(1024, 1.0F);
      for (int i = 0; i < 4 * warmup; ++i)
      {
        run_once(*first, data, i % 2 == 0);
      }
    }
    std::stringstream list(sizes);
    std::string item;
    while (std::getline(list, item, ','))
    {
      std::size_t const bytes = std::stoul(item);
      std::size_t const count = std::max<std::size_t>(1, bytes / sizeof(float));
      Registered allreduce(count);
      std::vector<float> data(count, 1.0F);
      for (char const* mode : {"progress", "wait"})
      {
        bool const by_thread = std::string(mode) == "progress";
        std::vector<double> micros;
        for (int i = 0; i < warmup + reps; ++i)
        {
          std::fill(data.begin(), data.end(), 1.0F);
          double const seconds = run_once(*allreduce, data, by_thread);
          if (i >= warmup)
          {
            micros.push_back(seconds * 1e6);
          }
        }
        if (is_rank_zero())
        {
          std::printf("latency %s %zu %.2f %.2f\n", mode, count * sizeof(float),
                      quantile(micros, 0.5), quantile(micros, 0.95));
          std::fflush(stdout);
        }
      }
    }
    return 0;
  }

  int setups(long count)
  {
    Registered resident(1024);  // stays registered, as Tarantella's gradients
    auto const expected = static_cast<float>(gaspi::getRuntime().size());
    for (long i = 0; i < count; ++i)
    {
      std::size_t const elements = 1 + static_cast<std::size_t>(i % 64);
      Registered fresh(elements);
      std::vector<float> data(elements, 1.0F);
      run_once(*fresh, data, true);
      if (data.front() != expected || data.back() != expected)
      {
        std::fprintf(stderr, "setup %ld: sum %f, expected %f\n", i, data.front(), expected);
        return 1;
      }
      if (is_rank_zero())
      {
        std::printf("setup %ld\n", i + 1);
        std::fflush(stdout);
      }
    }
    return 0;
  }
}

int main(int argc, char* argv[])
{
  std::string const what = argc > 1 ? argv[1] : "";
  if (!(what == "latency" && argc == 5) && !(what == "setups" && argc == 3))
  {
    std::fprintf(stderr, "usage: %s latency BYTES[,BYTES...] REPS WARMUP | setups COUNT\n",
                 argv[0]);
    return 2;
  }
  gaspi::initGaspiCxx();
  int const status = what == "latency"
    ? latency(argv[2], std::atoi(argv[3]), std::atoi(argv[4]))
    : setups(std::atol(argv[2]));
  gaspi::getRuntime().barrier();
  return status;
}
