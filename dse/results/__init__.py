"""What a person reads of a run: the one run reader (``reader``), the Pareto report
(``report``, ``report_page``, ``pages``), the terminal tables (``terminal``), comparisons
(``compare``), what-ifs (``whatif``, ``reoptimize``) and their uncertainty bands
(``bands_report``)."""
