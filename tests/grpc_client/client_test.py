"""Drives `zerod serve` as a scheduler would, from Python over gRPC (stubs from proto/zerod.proto):
submit -> watch -> checkpoint -> stop with a checkpoint -> resume -> status, checking every field
of JobStatus on the way, and the refusals' status codes.

Usage: client_test.py ZEROD_BINARY WORK_DIR   (WORK_DIR/stubs holds the generated modules)
"""
import json
import os
import struct
import subprocess
import sys
import time

ZEROD, WORK = sys.argv[1], os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.join(WORK, "stubs"))
import grpc  # noqa: E402
import zerod_pb2 as pb  # noqa: E402
import zerod_pb2_grpc as rpc  # noqa: E402

BATCH = 8
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise AssertionError(what)
    checks += 1


def write_shard(path, tokens):
    """An llm.c token shard: 256 int32 header (magic 20240520, version 1, count), uint16 tokens."""
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def code_of(call):
    try:
        call()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def wait_for(stub, pred, what, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
        if pred(s):
            return s
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last status:\n{s}")


def check_running(s, job_id, first_step=1):
    """Every field of a running job's status after a few steps."""
    check(s.state == pb.JOB_STATE_RUNNING, f"state {s.state}")
    check(s.job_id == job_id, f"job_id {s.job_id}")
    check(s.reason == "", f"reason {s.reason!r}")
    check(s.step >= first_step, f"step {s.step}")
    check(s.total_steps == 100000, f"total_steps {s.total_steps}")
    check(0 < s.loss < 10, f"loss {s.loss}")
    check(0 < s.lr <= 3e-3, f"lr {s.lr}")
    check(s.tokens_per_s > 0, f"tokens_per_s {s.tokens_per_s}")
    check(0 < s.mfu <= 1.0, f"mfu {s.mfu}")
    check(s.eta_seconds > 0, f"eta_seconds {s.eta_seconds}")
    check(len(s.memory) == 2 and sorted(m.rank for m in s.memory) == [0, 1],
          f"memory {s.memory}")
    check(all(0 < m.current_bytes <= m.peak_bytes for m in s.memory), f"memory {s.memory}")
    check(s.world_size == 2, f"world_size {s.world_size}")
    check(not s.stopped, "stopped while running")
    check(s.elapsed_seconds > 0, f"elapsed_seconds {s.elapsed_seconds}")
    check(s.job_name == "job.json", f"job_name {s.job_name!r}")
    check(s.grad_norm > 0, f"grad_norm {s.grad_norm}")
    check(s.loss_scale == 1.0, f"loss_scale {s.loss_scale}")
    check(s.samples_seen == s.step * BATCH, f"samples_seen {s.samples_seen} at step {s.step}")


def main():
    data = os.path.join(WORK, "data")
    os.makedirs(data)
    text = ("a scheduler drives zerod from python over grpc. " * 2000).encode()
    write_shard(os.path.join(data, "t_train_000.bin"), list(text[: len(text) * 9 // 10]))
    write_shard(os.path.join(data, "t_val_000.bin"), list(text[len(text) * 9 // 10:]))
    job = {"train_batch_size": BATCH, "train_micro_batch_size_per_gpu": 4,
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
           "zero_optimization": {"stage": 2}, "steps_per_print": 1000,
           "model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 256, "seq_len": 32},
           "data": {"train": "data/t_train_*.bin", "val": "data/t_val_*.bin"},
           "train": {"steps": 100000, "checkpoint_dir": "ckpt", "eval_interval": 5,
                     "eval_batches": 2}}
    sock = os.path.join(WORK, "d.sock")
    log = open(os.path.join(WORK, "daemon.log"), "w")
    daemon = subprocess.Popen([ZEROD, "serve", "--listen", "unix:" + sock, "--state-dir",
                               os.path.join(WORK, "state"), "--nproc-per-node", "2"],
                              cwd="/", stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while not os.path.exists(sock) and time.time() < deadline:
            time.sleep(0.05)
        channel = grpc.insecure_channel("unix:" + sock)
        grpc.channel_ready_future(channel).result(timeout=30)
        stub = rpc.ControlStub(channel)

        idle = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
        check(idle.state == pb.JOB_STATE_IDLE, f"a fresh daemon is idle: {idle}")

        # Submit, with the job file's directory for its relative paths (the daemon runs in /).
        job_text = json.dumps(job)
        code, details = code_of(lambda: stub.SubmitJob(
            pb.SubmitJobRequest(job_json=job_text, name="job.json"), timeout=30))
        check(code == grpc.StatusCode.INVALID_ARGUMENT and "data.train" in details,
              f"relative paths with no base_dir: {code} {details}")
        code, details = code_of(lambda: stub.SubmitJob(pb.SubmitJobRequest(
            job_json=job_text, name="job.json", base_dir=WORK, resume="nope"), timeout=30))
        check(code == grpc.StatusCode.NOT_FOUND, f"resume from a missing tag: {code} {details}")
        r = stub.SubmitJob(pb.SubmitJobRequest(job_json=job_text, name="job.json",
                                               base_dir=WORK), timeout=30)
        check(r.job_id == "job-1", f"job id {r.job_id}")

        # Watch until step 6 (past the first evaluation, at step 5).
        seen = []
        watch = stub.WatchStatus(pb.WatchStatusRequest(max_interval_ms=200), timeout=120)
        for s in watch:
            seen.append(s)
            if s.step >= 6 and s.HasField("val_loss"):
                break
        watch.cancel()
        last = seen[-1]
        check_running(last, "job-1", 6)
        check(0 < last.val_loss < 10, f"val_loss {last.val_loss}")
        check([s.step for s in seen] == sorted(s.step for s in seen), "steps never go back")
        check(not seen[0].HasField("val_loss") or seen[0].step >= 5,
              "no validation loss before the first evaluation")

        # Checkpoints by command: committed when the call returns, newest on disk in status.
        saved = stub.SaveCheckpoint(pb.SaveCheckpointRequest(tag="py-tag"), timeout=60)
        check(saved.tag == "py-tag" and saved.step >= 6, f"save: {saved}")
        check(os.path.exists(os.path.join(WORK, "ckpt", "py-tag", "manifest.json")),
              "the checkpoint is in the job file's directory")
        s = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
        check(s.last_checkpoint == "py-tag", f"last_checkpoint {s.last_checkpoint}")
        code, details = code_of(lambda: stub.SaveCheckpoint(
            pb.SaveCheckpointRequest(tag="py-tag"), timeout=60))
        check(code == grpc.StatusCode.ALREADY_EXISTS, f"save a tag twice: {code} {details}")
        again = stub.SaveCheckpoint(pb.SaveCheckpointRequest(tag="py-tag", overwrite=True),
                                    timeout=60)
        check(again.step >= saved.step, f"overwrite: {again}")
        listed = stub.ListCheckpoints(pb.ListCheckpointsRequest(), timeout=10)
        check(listed.checkpoint_dir.endswith("ckpt"), f"checkpoint_dir {listed.checkpoint_dir}")
        tags = {c.tag: c for c in listed.checkpoints}
        check("py-tag" in tags and tags["py-tag"].latest, f"listed {listed}")
        check(tags["py-tag"].world_size == 2 and tags["py-tag"].zero_stage == 2
              and tags["py-tag"].bytes > 0 and tags["py-tag"].global_step == again.step,
              f"listed {tags['py-tag']}")
        code, _ = code_of(lambda: stub.Resume(pb.ResumeRequest(), timeout=10))
        check(code == grpc.StatusCode.FAILED_PRECONDITION, f"resume while running: {code}")

        # Stop with a checkpoint: finished, stopped, its checkpoint the newest.
        stub.Stop(pb.StopRequest(checkpoint=True), timeout=10)
        done = wait_for(stub, lambda s: s.state == pb.JOB_STATE_FINISHED, "the stop")
        check(done.stopped and done.job_id == "job-1", f"stopped: {done}")
        check(done.last_checkpoint == f"global_step{done.step}",
              f"last_checkpoint {done.last_checkpoint} at step {done.step}")
        check(done.samples_seen == done.step * BATCH, f"samples_seen {done.samples_seen}")
        stopped_at = done.step

        # Resume: job-2 from that checkpoint, running on from the next step.
        r = stub.Resume(pb.ResumeRequest(), timeout=30)
        check(r.job_id == "job-2", f"resume id {r.job_id}")
        s = wait_for(stub, lambda s: s.job_id == "job-2" and s.step >= stopped_at + 2,
                     "two steps of the resumed job")
        check_running(s, "job-2", stopped_at + 2)
        stub.Stop(pb.StopRequest(), timeout=10)
        end = wait_for(stub, lambda s: s.state == pb.JOB_STATE_FINISHED, "the second stop")
        check(end.stopped and end.job_id == "job-2" and end.step > stopped_at, f"end: {end}")
        check(end.last_checkpoint == f"global_step{stopped_at}",
              f"a plain stop saves nothing: {end.last_checkpoint}")
        print(f"ok: {checks} checks of the daemon from Python (grpcio {grpc.__version__})")
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()


try:
    main()
except Exception:
    with open(os.path.join(WORK, "daemon.log")) as f:
        sys.stderr.write("daemon log:\n" + f.read()[-6000:])
    raise
