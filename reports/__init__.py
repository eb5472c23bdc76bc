"""The comparative audit: workload utility, JSON/Markdown/HTML reports and plots."""
