"""The pair-embedding store: numpy slabs, TTL by time buckets, versions, running sums."""
