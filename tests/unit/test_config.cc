// Config (common/config.h): the job's settings, the tunables in force, versions.
#include "check.h"
#include "common/config.h"
#include "requests.h"

using namespace hvdlite;

TEST(config_tunables_start_at_job_values) {
  Parameters p;
  p.fusion_threshold_bytes = 32 << 20;
  p.cycle_time_ms = 2.5;
  p.cache_capacity = 100;
  p.two_level.allreduce = 1;
  Config config(p);
  CHECK_EQ(config.tunables().fusion_threshold_bytes, 32 << 20);
  CHECK_EQ(config.tunables().cycle_time_ms, 2.5);
  CHECK_EQ(config.tunables().cache_enabled, 1);
  CHECK_EQ(config.tunables().hierarchical, 1);
  CHECK_EQ(config.cycle_time_us(), 2500);
  CHECK_EQ(config.job().cache_capacity, 100);
  CHECK_EQ(config.version(), 0u);
  Parameters off;
  off.cache_capacity = 0;  // HOROVOD_CACHE_CAPACITY=0
  CHECK_EQ(Config(off).tunables().cache_enabled, 0);
}

TEST(config_apply_bumps_version_and_snapshot_counts) {
  Config config{Parameters{}};
  int64_t applied = -1;
  Tunables before = config.Snapshot(&applied);
  CHECK_EQ(applied, 0);
  Tunables t = before;
  t.fusion_threshold_bytes = 4 << 20;
  t.cycle_time_ms = 0.5;
  config.Apply(t);
  CHECK_EQ(config.version(), 1u);
  CHECK(config.tunables() == t);
  CHECK_EQ(config.cycle_time_us(), 500);
  t.cache_enabled = 0;
  config.Apply(t);
  CHECK_EQ(config.version(), 2u);
  Tunables now = config.Snapshot(&applied);
  CHECK_EQ(applied, 2);
  CHECK(now == t);
  CHECK(now != before);
  // The job's settings stay as they were.
  CHECK_EQ(config.job().fusion_threshold_bytes, Parameters{}.fusion_threshold_bytes);
  CHECK_EQ(config.job().cycle_time_ms, Parameters{}.cycle_time_ms);
  CHECK(config.Snapshot() == t);  // the count is optional
}

TEST(config_set_fusion_bumps_version_not_applied_count) {
  Config config{Parameters{}};
  config.SetFusion(unit::Limits(100, 10, 200, 300), unit::Limits(1000));
  CHECK_EQ(config.version(), 1u);
  int64_t applied = -1;
  config.Snapshot(&applied);
  CHECK_EQ(applied, 0);
  CHECK_EQ(config.fusion(DeviceKind::kHost).allreduce_bytes, 100);
  CHECK_EQ(config.fusion(DeviceKind::kHost).allgather_tensor_bytes, 10);
  CHECK_EQ(config.fusion(DeviceKind::kHost).allgather_bytes, 200);
  CHECK_EQ(config.fusion(DeviceKind::kHost).reducescatter_bytes, 300);
  CHECK_EQ(config.fusion(DeviceKind::kCuda).allreduce_bytes, 1000);
  CHECK_EQ(KindOfDevice(kCpuDevice), DeviceKind::kHost);
  CHECK_EQ(KindOfDevice(3), DeviceKind::kCuda);
}

TEST(config_names_ranks_with_their_hosts) {
  Config with_hosts(Parameters{}, {"h1", "h1", "h2"});
  CHECK_EQ(with_hosts.RankName(2), std::string("rank 2 (host h2)"));
  CHECK_EQ(with_hosts.RankNames({0, 2}), std::string("[0 (h1), 2 (h2)]"));
  CHECK_EQ(with_hosts.RankName(7), std::string("rank 7"));  // not a rank of this world
  Config without(Parameters{});
  CHECK_EQ(without.RankName(1), std::string("rank 1"));
  CHECK_EQ(without.RankNames({1, 3}), std::string("[1, 3]"));
  CHECK_EQ(without.RankNames({}), std::string("[]"));
}
