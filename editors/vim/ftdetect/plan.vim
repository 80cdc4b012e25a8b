" planlang: distributed-training plans (*.plan)
autocmd BufNewFile,BufRead *.plan setfiletype plan
