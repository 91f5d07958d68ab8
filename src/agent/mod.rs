//! The agent (`herald agent`): watch notices and a person's (or a Slack channel's) messages as
//! turns of an LLM, which acts through one tool, `run_code`, backed by herald's code mode.
//! Reference 000, "Delivery to the agent".

pub mod model;
