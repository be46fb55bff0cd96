"""What people read: plans, jobs, the live view, logs, comparisons and the HTML report.
Views read the store; they never change it."""
