//! Sync jobs (`sync_jobs`): what should run, durable and shared by every instance. A
//! schedule slot of a connection is one job whichever instance computes it first; runs
//! asked for, retries and resumed runs are jobs too; any free instance claims the most
//! urgent due job and runs it under the connection's lease (docs/decisions/job-queue.md).

mod inbox;
mod queue;
mod run;

pub(crate) use inbox::process_due;
pub(crate) use queue::{
    any_due, cancel, cancel_requested, claim, enqueue, insert_claimed, insert_queued,
    requeue_orphans, CancelOutcome, Claimed, NewJob,
};
pub(crate) use run::{finish_on_the_spot, run, JobContext, RetryPolicy};
