"""ATM-Bench (JingbiaoMei/ATM-Bench): its data, frames and answer scoring, ported to AML."""
