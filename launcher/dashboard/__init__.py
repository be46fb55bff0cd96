"""`launch dashboard`: a read-only web view of the job store (Starlette; the optional extra ``launch[dashboard]``)."""
