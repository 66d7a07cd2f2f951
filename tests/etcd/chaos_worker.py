"""A Python worker of the chaos test (tests/etcd/ha_chaos_test.cc): the real client
(python/traincoord), given every coordinator's url in TRAINCOORD_URL, the run in TRAINCOORD_RUN
and its name in TRAINCOORD_WORKER, working flat out (JOB_MS milliseconds a job, default 0).
MODE "loop": `for job in run.jobs()`, each completion sent with the request for the next job;
"each": `run.next_job()`, and `job.complete()` sent at once.

Each job's completion is printed with what the coordinator answered it, once that answer came:
    OUTCOME SET EPOCH INDEX      (OUTCOME: accepted, duplicate, lost, ...)
then "finished STATE". ("loop" prints a completion's line when the loop hands out the next
job, which may wait at an epoch's barrier: a line may come late; "each" prints it once
answered.) The loss is the C++ example worker's (examples/cpp_worker), a function of the job
alone, so that early stopping decides the same in every run of the same config.

    TRAINCOORD_URL=http://a:1,http://b:2 TRAINCOORD_RUN=chaos TRAINCOORD_WORKER=py0 \\
        PYTHONPATH=python /usr/bin/python3 tests/etcd/chaos_worker.py [MODE [JOB_MS]]"""

import sys
import time

import traincoord


def loss_of(job):
    return 1.0 / (1.0 + job.epoch) + 0.001 * (job.index % 7)


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "loop"
    job_ms = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    run = traincoord.Run.from_env(give_up_after=60)
    told = []  # jobs whose completion was sent, oldest first, not yet printed

    def say(done):
        while told and (told[0].outcome is not None or done):
            job = told.pop(0)
            print(f"{job.outcome or 'unanswered'} {job.set} {job.epoch} {job.index}", flush=True)

    def train(job):
        if job_ms:
            time.sleep(job_ms / 1000)
        loss = loss_of(job)
        job.complete(loss, samples=len(job.batches) * 32, accuracy=1.0 - loss / 2)
        told.append(job)

    if mode == "loop":
        # The usual loop: a completion travels with the request for the next job, its outcome
        # known once that reply came (printed then, or at the end).
        for job in run.jobs():
            say(False)
            train(job)
    else:
        # "each": a completion sent at once (outside the loop), its outcome printed at once.
        job = run.next_job()
        while job is not None:
            train(job)
            say(False)
            job = run.next_job()
    say(True)
    print("finished", run.finished.state if run.finished else "?", flush=True)
    run.close()


if __name__ == "__main__":
    main()
