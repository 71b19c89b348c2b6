"""The coordinator's heartbeats answer the agents': each agent's beat gets the coordinator's in the
same wakeup (the reply carries the TCP ACK of the agent's beat; docs/performance.md, heartbeats),
instead of a beat on a timer of the coordinator's own at an unrelated moment. The agents are
bench/rendezvous's fake_agents, beating every second as real agents do."""
import os

from fake_agents import launch_against_fake_agents

NODES = 3


def test_the_coordinator_answers_each_agents_beat(tmp_path):
    # Workers that run 4.5 s: about four beats from each agent while the job runs.
    got = launch_against_fake_agents(tmp_path, NODES, "beats", ["--work-ms", "4500", "--heartbeat-ms", "1000"])
    assert got["agent_beats"] >= 3 * NODES, got
    # Answered within 100 ms: every beat, but for one sent as the job ended or a reply a loaded
    # machine held up (hence 60%, not all); a coordinator beating on a timer of its own lands
    # within 100 ms of an agent's beat about one time in ten (the old one: 0 of 14).
    assert got["coordinator_answers"] >= 0.6 * got["agent_beats"], got
    assert got["coordinator_answers"] >= 0.6 * got["coordinator_beats"], got


# Protocol version 7: the coordinator offers a third of the job's heartbeat_timeout (1 to 10 s),
# an agent beats at that or a third of its own timeout, whichever is shorter, and says so in its
# join; the coordinator answers each beat and beats on its own only to a node silent for 1.25 of
# its interval. Workers run 11 s.
WORK = ["--work-ms", "11000"]


def test_agents_beat_at_a_third_of_the_jobs_timeout(tmp_path):
    got = launch_against_fake_agents(tmp_path, NODES, "slow-beats", WORK + ["--agent-timeout-ms", "15000"],
                                     job_extra="rendezvous: {heartbeat_timeout: 15s}\n")
    assert got["beat_ms"] == [5000] * NODES, got
    # About 11 s of job at one beat per 5 s (plus the first, at once): at most 4 each, where
    # beats every second would be 11 or more; the job lost no node meanwhile (it succeeded).
    assert NODES <= got["agent_beats"] <= 4 * NODES, got
    # The coordinator answers them and adds none of its own (its own would come only after
    # 6.25 s without an answer).
    assert got["coordinator_beats"] <= got["agent_beats"] + NODES, got
    assert got["coordinator_answers"] >= 0.6 * got["agent_beats"], got


def test_an_agents_own_timeout_bounds_its_interval(tmp_path):
    # The same job, agents with the default heartbeat_timeout (6 s): every 2 s, so that the
    # coordinator, answering, beats them often enough for their own timeout.
    got = launch_against_fake_agents(tmp_path, NODES, "agent-bound", WORK,
                                     job_extra="rendezvous: {heartbeat_timeout: 15s}\n")
    assert got["beat_ms"] == [2000] * NODES, got
    assert 4 * NODES <= got["agent_beats"] <= 8 * NODES, got
    assert got["coordinator_answers"] >= 0.6 * got["agent_beats"], got


def test_agents_of_version_6_still_beat_every_second(tmp_path):
    got = launch_against_fake_agents(tmp_path, NODES, "old-beats", WORK + ["--version", "6", "--agent-timeout-ms", "15000"],
                                     job_extra="rendezvous: {heartbeat_timeout: 15s}\n")
    assert got["beat_ms"] == [1000] * NODES, got
    assert got["agent_beats"] >= 9 * NODES, got
    assert got["coordinator_answers"] >= 0.6 * got["agent_beats"], got


# At scale the coordinator handles the steady state's beats in batches, a pass every 10 ms, once
# the joined nodes' beats come two or more to a period (more than 200 a second): 256 agents
# beating every second. Each beat is still answered promptly (the pass adds at most 20 ms), and
# a job of a few nodes is never paced. The coordinator says when it starts (debug log).
PACED = "heartbeats: 256 a second from the joined nodes; handled in batches"


def test_a_coordinator_of_many_nodes_answers_their_beats_in_batches(tmp_path):
    env = dict(os.environ, DDP_LOG_LEVEL="debug", DDP_LOG_SUBSYS="coord")
    err = []
    got = launch_against_fake_agents(tmp_path, 256, "paced", ["--work-ms", "4000", "--heartbeat-ms", "1000"],
                                     env=env, stderr=err)
    assert PACED in err[0], err[0][-3000:]
    # Each agent beats three times or more while its worker runs; the paced coordinator answers
    # (within 100 ms of the beat, as fake_agents counts) at least as often as unpaced (above).
    assert got["agent_beats"] >= 3 * 256, got
    assert got["coordinator_answers"] >= 0.6 * got["agent_beats"], got

    few = []
    (tmp_path / "few").mkdir()
    launch_against_fake_agents(tmp_path / "few", NODES, "unpaced", ["--work-ms", "3000", "--heartbeat-ms", "1000"],
                               env=env, stderr=few)
    assert "handled in batches" not in few[0], few[0][-3000:]
