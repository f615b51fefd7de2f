"""Classic groups: Kafka's classic group protocol (JoinGroup, SyncGroup, Heartbeat,
LeaveGroup) as a Kafka broker runs it, for Connect workers that speak only that protocol.

`state` holds the groups as their records describe them; `engine` is the sans-IO state
machine (requests and now in; answers, records, timers and parked-request releases out).
"""
