//! One integration-test binary driving the real `herald` binary over its real transports.

mod admin;
mod agent;
mod badinput;
mod dist;
mod durability;
mod events;
mod fake_model;
mod file;
mod filter;
mod flood;
mod gateway;
mod k8s;
mod legacy;
mod kube_fake;
mod manager;
mod memo;
mod poll;
mod slack;
mod slack_fake;
mod store;
mod support;
mod systemd;
mod tasks;
mod up;
mod watch;
mod wire;
