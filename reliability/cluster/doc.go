// Package cluster is the cluster suite: publishers with confirms and
// consumers with manual acks run in every read mode against a real
// three-node RabbitMQ cluster (internal/cluster starts it from the
// machine's own install, each node in its own network namespace), while
// nodes are killed, stopped, cut off and frozen (internal/clusterfaults
// runs the cells).
//
// Each fault is injected once for all three variants at the same time,
// each with its own quorum queue replicated on the three nodes:
//
//   - upstream: upstream's automatic recovery over the endpoint list and
//     the retry loop its documentation suggests; measured, not judged;
//   - drainer and legacy: package failover's Publisher and Consume over
//     compat.DialCluster (legacy with failover's drain loop).
//
// After each cell it checks, by message ID, that every confirmed message
// was consumed or is still in the queue (lost = 0), that nothing was found
// that was never published, that every publish call returned within its
// bound, that Close during a cut returned within CloseTimeout, and, after
// a fault that takes the consumer's node away (4, 6b, 8c), that the consumer
// handled deliveries on a new connection. TestRecoveringConsumer checks
// the same of a plain amqp091 consumer with Config.Recovery over
// compat.DialCluster's endpoint list when its node is killed. Times to
// resume are printed against the targets in a table (also written
// to .cache/cluster/faults.md), each split into the broker's share (until
// a fresh channel on a node the fault spares has a publish confirmed) and
// the client's, with a timeline of every failover run; as timing targets
// they are judged by the benchmark, not here.
//
// A plain go test ./... skips it. AMQP091_CLUSTER=short (.ci/run) runs each
// fault once; AMQP091_CLUSTER=full (make cluster) three times, 39 faults
// per mode. Each fault is a subtest named by its ID and round, so that
// go test -run 'TestFaults/5pmL$' runs every round of one fault. Where the
// machine cannot run a cluster (not root, no ip netns, no RabbitMQ
// install) it skips with the reason.
package cluster
